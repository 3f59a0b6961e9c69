"""experiments/superres_input_use.py: bits/dim given the image's own 8×8 input and another
image's, and the gain over a plain model by position, equal to what the model computes."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from experiments.tests.conftest import REPO_ROOT, tiny_model, write_cifar_npz
from imagetx import load_model, save_pretrained
from imagetx.model.superres import downsample_area
from imagetx.model.sampler import sample
from imagetx.data.sources import load


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.superres_input_use", *args],
                          capture_output=True, text=True, cwd=REPO_ROOT)


@pytest.fixture(scope="module")
def superres_ckpt(tmp_path_factory):
    # 32×32 DMOL decoder (1024 cheap steps) with a one-layer encoder over the 8×8 input.
    model = tiny_model(seed=31, image_size=32, head="dmol", query_block_length=64, encoder_layers=1, low_res_size=8)
    path = tmp_path_factory.mktemp("sr") / "sr"
    save_pretrained(model, path)
    return path


def test_input_use_script_compares_own_and_borrowed_inputs(tmp_path, superres_ckpt):
    root = tmp_path / "data"
    write_cifar_npz(root, train_sizes=(6,))
    out = tmp_path / "use.json"
    done = run_script(str(superres_ckpt), "--data.root", str(root), "--split", "val",
                      "--val_size", "4", "--count", "3", "--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    images = load("cifar10", root, "val", val_size=4)[0][:3]
    model = load_model(superres_ckpt)
    low_res = downsample_area(images, 8)
    with torch.no_grad():
        own = model.bits_per_dim(images, low_res=low_res).mean().item()
        other = model.bits_per_dim(images, low_res=low_res[[2, 0, 1]]).mean().item()
    assert math.isclose(result["bpd_own_input"], own, rel_tol=1e-6)
    assert math.isclose(result["bpd_other_image_input"], other, rel_tol=1e-6)
    assert result["images"] == 3


def test_input_use_script_class_conditional_and_bad_checkpoint(tmp_path):
    root = tmp_path / "data"
    write_cifar_npz(root, train_sizes=(6,))
    ckpt = tmp_path / "cond"
    save_pretrained(tiny_model(image_size=32, head="dmol", query_block_length=64, encoder_layers=1, low_res_size=8,
                               num_classes=10), ckpt)
    common = ["--data.root", str(root), "--split", "val", "--val_size", "4", "--count", "2"]
    done = run_script(str(ckpt), *common)
    assert done.returncode == 0, done.stderr  # labels are passed to a class-conditional model
    assert json.loads(done.stdout.strip().splitlines()[-1])["images"] == 2
    missing = run_script(str(tmp_path / "nope.ckpt"), *common)
    assert missing.returncode != 0
    assert missing.stderr.strip().startswith("error:") and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_input_use_script_compares_with_a_baseline_position_by_position(tmp_path, superres_ckpt):
    root = tmp_path / "data"
    write_cifar_npz(root, train_sizes=(6,))
    baseline = tmp_path / "plain"
    save_pretrained(tiny_model(seed=5, image_size=32, head="dmol", query_block_length=64), baseline)
    common = ["--data.root", str(root), "--split", "val", "--val_size", "4", "--count", "3"]
    done = run_script(str(superres_ckpt), *common, "--baseline", str(baseline))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    images = load("cifar10", root, "val", val_size=4)[0][:3]
    with torch.no_grad():  # raster order over 32x32 pixels: step 32·row + col
        sr_bits = -load_model(superres_ckpt).log_prob(images, low_res=downsample_area(images, 8)).view(3, 32, 32)
        base_bits = -load_model(baseline).log_prob(images).view(3, 32, 32)
    gain = (base_bits - sr_bits).mean(dim=0) / (3 * math.log(2))  # bits per sub-pixel
    assert math.isclose(result["gain_first_image_column"], gain[:, 0].mean().item(), abs_tol=1e-4)
    for j in range(4):
        assert math.isclose(result["gain_by_cell_column"][j], gain[:, j::4].mean().item(), abs_tol=1e-4)
        assert math.isclose(result["gain_by_cell_row"][j], gain[j::4].mean().item(), abs_tol=1e-4)
    own_baseline = load_model(baseline).bits_per_dim(images).mean().item()
    assert math.isclose(result["gain_overall"], own_baseline - result["bpd_own_input"], abs_tol=1e-4)
    wrong = run_script(str(superres_ckpt), *common, "--baseline", str(superres_ckpt))
    assert wrong.returncode != 0 and "without encoder" in wrong.stderr and "Traceback" not in wrong.stderr


@pytest.mark.slow
def test_box_means_of_the_samples_are_measured_against_their_own_inputs(tmp_path, superres_ckpt):
    root = tmp_path / "data"
    write_cifar_npz(root, train_sizes=(6,))
    common = [str(superres_ckpt), "--data.root", str(root), "--split", "val", "--val_size", "4", "--count", "3"]
    done = run_script(*common, "--box_means_at", "1.0", "--samples", "2")
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout.strip().splitlines()[-1])["box_mean_distance_at_1.0"]
    images = load("cifar10", root, "val", val_size=4)[0][:2]
    low_res = downsample_area(images, 8)
    drawn = sample(load_model(superres_ckpt), 2, None, low_res, 1.0, generator=torch.Generator().manual_seed(0))
    distance = (downsample_area(drawn, 8).float() - low_res.float()).abs()
    assert math.isclose(measured, distance.mean().item(), rel_tol=1e-6)
    for bad, named in ((["1.0", "--samples", "4"], "--samples 4"), (["-1"], "temperature -1.0")):
        refused = run_script(*common, "--box_means_at", *bad)
        assert refused.returncode != 0 and named in refused.stderr and "Traceback" not in refused.stderr
    refused = run_script(*common, "--device", "gpu0")
    assert refused.returncode != 0 and "--device 'gpu0' is not a device name" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_model_with_exact_box_means_is_compared_without_its_bounds_and_keeps_its_inputs(tmp_path):
    """Another image's input has no mass under the bounds (infinite bits/dim): the comparison is
    made with the same weights without them, the model's own score given beside it."""
    root = tmp_path / "data"
    write_cifar_npz(root, train_sizes=(6,))
    fields = dict(image_size=32, head="dmol", query_block_length=64, encoder_layers=1, low_res_size=8,
                  cell_remainder_input=True)
    bounded, free = tiny_model(seed=32, **fields, exact_box_means=True), tiny_model(seed=32, **fields)
    save_pretrained(bounded, tmp_path / "bounded")
    done = run_script(str(tmp_path / "bounded"), "--data.root", str(root), "--split", "val", "--val_size", "4",
                      "--count", "3", "--box_means_at", "1.0")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    images = load("cifar10", root, "val", val_size=4)[0][:3]
    low_res = downsample_area(images, 8)
    with torch.no_grad():
        assert torch.isposinf(bounded.bits_per_dim(images, low_res=low_res[[2, 0, 1]])).all()
        free_own = free.bits_per_dim(images, low_res=low_res).mean().item()
        free_other = free.bits_per_dim(images, low_res=low_res[[2, 0, 1]]).mean().item()
        bounded_own = bounded.bits_per_dim(images, low_res=low_res).mean().item()
    assert math.isclose(result["bpd_own_input"], free_own, rel_tol=1e-6)
    assert math.isclose(result["bpd_other_image_input"], free_other, rel_tol=1e-6)
    assert math.isclose(result["bpd_own_input_bounded"], bounded_own, rel_tol=1e-6)
    assert bounded_own < free_own  # the bounds move mass onto the values that can be
    assert result["box_mean_distance_at_1.0"] == 0.0
