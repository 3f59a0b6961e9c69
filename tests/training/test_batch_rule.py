"""The batch rule (imagetx/training/batch_rule.py; docs/experiments.md entry 38): a recipe set for one global
batch, run at another, takes its peak learning rate scaled by the rule and its warm-ups in the same images,
said in one line; without ``reference_batch`` nothing changes."""

from __future__ import annotations

import pytest
import yaml

from helpers import train_metrics, write_train_config
from imagetx.train import main as train_main
from imagetx.training.batch_rule import LR_EXPONENT, MEASURED_RATIO, BatchRule

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


def test_the_rule_scales_the_peak_and_keeps_the_warm_up_images():
    rule = BatchRule(reference=120, batch=960)
    assert rule.ratio == 8
    assert rule.peak_lr(0.004) == pytest.approx(0.004 * 8 ** LR_EXPONENT)
    assert rule.steps(1000) == 125 and rule.steps(100) == 12  # 1,000 x 120 images = 125 x 960
    assert "peak learning rate 0.004 ->" in rule.described(0.004, 1000)
    assert "extrapolated" not in rule.described(0.004, 1000)
    assert "extrapolated" in BatchRule(8, 8 * 2 * MEASURED_RATIO).described(0.004, 1000)
    for unset in (BatchRule(None, 960), BatchRule(120, None), BatchRule(120, 120)):
        assert unset.peak_lr(0.004) == 0.004 and unset.steps(1000) == 1000 and unset.described(0.004, 1000) is None
    assert BatchRule(8, 128).steps(11) == 1  # never a warm-up of no steps


@pytest.mark.parametrize("reference", [None, 2])
def test_a_run_at_twice_the_reference_batch_follows_the_rule(tmp_path, data_root, capsys, reference):
    """Batch 4 where the recipe says 2: the peak is 2 ** LR_EXPONENT times higher and reached in half the
    steps (warm-up 4 -> 2); without a reference batch the run keeps its settings."""
    config = write_train_config(tmp_path / "run.yaml", tmp_path / "run", data_root, 6, data={"batch_size": 4})
    values = yaml.safe_load(config.read_text())
    values["model"].update(optimizer="adamw_wsd", peak_lr=0.002, warmup_steps=4, lr_horizon="steps",
                           decay_fraction=0.2, reference_batch=reference)
    config.write_text(yaml.safe_dump(values))
    train_main(["--config", str(config), "--wandb", "disabled"])
    said = capsys.readouterr().out
    rates = train_metrics(tmp_path / "run", "lr-AdamW")
    peak = 0.002 * (2 ** LR_EXPONENT if reference else 1)
    warmup = 2 if reference else 4
    assert rates[warmup - 1] == pytest.approx(peak)  # the schedule's step `warmup` (the update after step warmup - 1)
    assert rates[warmup - 2] == pytest.approx(peak * (warmup - 1) / warmup)
    assert ("batch rule: global batch 4, 2x the recipe's 2" in said) == (reference is not None)
