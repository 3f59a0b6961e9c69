"""experiments/fresh_init_hash.py: a seeded model's hash is repeatable and tells a change apart."""

from __future__ import annotations

from experiments import fresh_init_hash


def test_the_same_seed_gives_the_same_hashes_and_another_seed_other_ones(capsys):
    first, again = fresh_init_hash.main([]), fresh_init_hash.main([])
    assert first["hashes"] == again["hashes"] and len(first["hashes"]) == len(fresh_init_hash.CONFIGS)
    other = fresh_init_hash.main(["--seed", "1"])  # negative control: other initial values, other hashes
    assert all(other["hashes"][name] != first["hashes"][name] for name in first["hashes"])
