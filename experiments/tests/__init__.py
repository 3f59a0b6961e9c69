"""Tests of the experiment scripts; pyproject.toml's testpaths makes ``pytest`` collect them."""
