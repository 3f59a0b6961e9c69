"""scripts/bench.py's plan: which configurations the benchmark measures, read from the presets
(the measurements themselves are the script's, run by hand: ``python -m scripts.bench --quick-smoke``)."""

from __future__ import annotations

from scripts.bench import build_parser, build_plan, resolve_defaults


def plan_of(*words: str) -> list[dict]:
    parser = build_parser()
    args = parser.parse_args(["--device", "cpu", *words])
    resolve_defaults(parser, args)
    return build_plan(args)


def test_each_preset_is_measured_with_its_own_attention_and_with_full_attention():
    plan = plan_of("--presets", "quick", "cifar10_2d", "--image-sizes", "32", "--no-sampling")
    assert [(spec["preset"], spec["attention"]) for spec in plan] == [
        ("quick", "local_1d"), ("quick", "full"), ("cifar10_2d", "local_2d"), ("cifar10_2d", "full")]


def test_no_full_measures_the_presets_attention_alone_and_sampling_with_it():
    plan = plan_of("--presets", "cifar10_2d", "--image-sizes", "32", "--no-full")
    assert [(spec["kind"], spec["attention"]) for spec in plan] == [("train", "local_2d"), ("sample", "local_2d")]
