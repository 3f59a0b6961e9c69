"""Benchmarks and plots for imagetx users.

A package so that one script can import another's helpers by name: run each one from
the repository root as a module, e.g. ``.venv/bin/python -m scripts.bench --help``.
"""
