"""The e-graph: rules from data files, saturation with egglog, and checking an e-graph against values."""
