"""imagetx.evaluate: bits/dim over a whole split equals a direct computation (docs/model.md §5, §6)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import random_images, tiny_model, write_cifar_npz
from imagetx import save_pretrained
from imagetx.evaluate import build_parser, main
from imagetx.model.scoring import evaluate

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

N_IMAGES = 13  # not a multiple of the batch size 4: the last batch has one image


def run_evaluate(capsys, args):
    main(args)
    out = capsys.readouterr().out
    return json.loads(out.strip().splitlines()[-1])


def setup_model_and_data(tmp_path, **overrides):
    model = tiny_model(seed=3, image_size=32, **overrides)
    ckpt = tmp_path / "model"
    save_pretrained(model, ckpt)
    root = tmp_path / "data"
    _, _, test_images, test_labels = write_cifar_npz(root, train_sizes=(3,), test_size=N_IMAGES)
    images = torch.from_numpy(test_images)
    labels = torch.from_numpy(test_labels).long()
    return model, ckpt, root, images, labels


CASES = [
    dict(head="dmol", query_block_length=64, position_encoding="learned"),
    dict(head="categorical", query_block_length=256, num_classes=10),  # labels must be used
]


@pytest.mark.parametrize("overrides", CASES, ids=["dmol", "categorical-conditional"])
def test_bpd_equals_direct_computation(tmp_path, capsys, overrides):
    model, ckpt, root, images, labels = setup_model_and_data(tmp_path, **overrides)
    result = run_evaluate(capsys, ["--ckpt", str(ckpt), "--data.root", str(root), "--split", "test",
                                   "--batch_size", "4", "--device", "cpu"])
    with torch.no_grad():
        nats = model.nll(images, labels if model.config.num_classes else None).double().sum().item()
    expected = nats / (N_IMAGES * 3072 * math.log(2))
    assert result["images"] == N_IMAGES
    assert result["bpd"] == pytest.approx(expected, rel=1e-5)
    assert result["split"] == "test" and result["task"] == "likelihood"
    # the average is over every image: leaving out the 13th would change it measurably
    with torch.no_grad():
        first12 = model.nll(images[:12], labels[:12] if model.config.num_classes else None).double().sum().item()
    assert abs(first12 / (12 * 3072 * math.log(2)) - expected) > 1e-4


def test_completion_bpd_scores_only_rows_below_the_prefix(tmp_path, capsys):
    model, ckpt, root, images, labels = setup_model_and_data(tmp_path, head="dmol", query_block_length=64)
    result = run_evaluate(capsys, ["--ckpt", str(ckpt), "--data.root", str(root), "--split", "test",
                                   "--batch_size", "4", "--device", "cpu", "--task", "complete", "--rows", "16"])
    with torch.no_grad():
        log_p = model.log_prob(images).double()  # (13, 1024) in raster order of pixels
    scored = model.step_rows >= 16
    assert int(scored.sum()) == 512
    expected = -log_p[:, scored].sum().item() / (N_IMAGES * 16 * 32 * 3 * math.log(2))
    assert result["images"] == N_IMAGES and result["rows"] == 16
    assert result["bpd"] == pytest.approx(expected, rel=1e-5)
    # and it differs from the whole-image score (the top half is not included)
    whole = -log_p.sum().item() / (N_IMAGES * 3072 * math.log(2))
    assert abs(result["bpd"] - whole) > 1e-4


def test_evaluate_scores_in_eval_mode_and_leaves_the_callers_mode():
    model = tiny_model(seed=3, image_size=8, head="dmol", query_block_length=16, dropout=0.3)
    images = random_images(5, 8, seed=1)
    in_eval_mode = evaluate(model, images, None, batch_size=2, progress=False)["bpd"]
    assert not model.training
    model.train()
    with torch.no_grad():  # dropout is on: the model alone scores differently on each call
        assert not torch.equal(model.bits_per_dim(images), model.bits_per_dim(images))
    first = evaluate(model, images, None, batch_size=2, progress=False)["bpd"]
    second = evaluate(model, images, None, batch_size=2, progress=False)["bpd"]
    assert first == second == in_eval_mode
    assert all(module.training for module in model.modules())


def test_missing_checkpoint_exits_2(tmp_path, capsys):
    write_cifar_npz(tmp_path / "data", train_sizes=(3,), test_size=2)
    with pytest.raises(SystemExit) as info:
        main(["--ckpt", str(tmp_path / "nope.ckpt"), "--data.root", str(tmp_path / "data"), "--device", "cpu"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "nope.ckpt" in err


def test_evaluate_and_sample_read_the_same_split_by_default():
    """val: the split every source that trains has (the shared CIFAR-10 shards and a folder have no
    test split), so both commands run on the data training ran on without --split."""
    from imagetx import sample

    assert build_parser().get_defaults().split == sample.build_parser().get_defaults().split == "val"


@pytest.mark.parametrize("flag", ["--data.val_size", "--val_size"])  # training's spelling, and the older one
def test_val_size_is_taken_as_training_takes_it(tmp_path, capsys, flag):
    model = tiny_model(seed=3, image_size=32, head="dmol", query_block_length=64)
    save_pretrained(model, tmp_path / "model")
    held_out = 5  # fewer than the 12 training images written, and not the default (5,000)
    write_cifar_npz(tmp_path / "data", train_sizes=(6, 6))
    result = run_evaluate(capsys, ["--ckpt", str(tmp_path / "model"), "--data.root", str(tmp_path / "data"),
                                   "--split", "val", flag, str(held_out), "--device", "cpu"])
    assert result["images"] == held_out


def test_val_sizes_that_disagree_are_refused(tmp_path, capsys):
    _, ckpt, root, _, _ = setup_model_and_data(tmp_path, head="dmol", query_block_length=64)
    with pytest.raises(SystemExit) as info:
        main(["--ckpt", str(ckpt), "--data.root", str(root), "--data.val_size", "2", "--val_size", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--data.val_size 2" in err and "--val_size 1" in err


def test_in_a_log_the_bar_redraws_sparingly(tmp_path, capsys, monkeypatch):
    """Issue 111: where stderr is not a terminal (pytest's capture, a log file) every redraw is a line
    of the log, and evaluate redrew at each batch taking tqdm's 0.1 s: now at most every
    LOG_PROGRESS_SECONDS, as sampling's bar. A clock of tqdm's own advancing 1 s at each look makes
    each batch take seconds, whatever this machine's speed."""
    import itertools

    import tqdm.std

    from imagetx.model.sampler import LOG_PROGRESS_SECONDS

    _, ckpt, root, _, _ = setup_model_and_data(tmp_path, head="dmol", query_block_length=64)
    clock = itertools.count()
    monkeypatch.setattr(tqdm.std, "time", lambda: float(next(clock)))
    main(["--ckpt", str(ckpt), "--data.root", str(root), "--split", "test", "--batch_size", "1", "--device", "cpu"])
    redraws = capsys.readouterr().err.count("evaluating:")
    # the first and the last, and one for each LOG_PROGRESS_SECONDS that pass (13 batches: none)
    assert N_IMAGES < LOG_PROGRESS_SECONDS and redraws <= 3, redraws
