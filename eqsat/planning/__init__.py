"""Planning one signature: capture, saturate, extract, tune; and planning's answers to a refusal."""
