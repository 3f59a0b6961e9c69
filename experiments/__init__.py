"""One-off analyses behind this project's choices; experiments/README.md says what each answered.

A package so that the scripts share ``experiments.json_result`` by name: run each one
from the repository root as a module, e.g. ``.venv/bin/python -m experiments.budget_sweep --help``.
"""
