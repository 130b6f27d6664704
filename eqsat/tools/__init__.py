"""The tools around the runtime: the command line, the demo's examples, fuzzing, program generators, rule
verification, calibration and the HTML report. The runtime (capture to planning and the API) never imports them."""
