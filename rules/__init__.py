"""Built-in rewrite rules, one egglog file per group; loaded at run time by eqsat.egraph.rule_sources."""
