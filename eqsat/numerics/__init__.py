"""How values and times are drawn, measured and compared: samples, timings, the timing guard's statistics, tolerances
and the float64 reference."""
