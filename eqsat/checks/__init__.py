"""Checks that take a plan and values and return verdicts: validation and the memory budget."""
