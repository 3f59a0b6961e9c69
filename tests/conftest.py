"""pytest fixtures shared by the tests; plain helpers are in helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import lightning  # noqa: F401  (first imported here: see below)
import pytest
import torch

from helpers import write_cifar_npz

# Lightning gives its loggers a handler on the sys.stderr of the moment it is first imported.
# Imported here, at collection, that is pytest's session-long capture; imported first inside a
# test that captures its output (capsys), it would be that test's stream, closed after the test,
# and every later log line ("Seed set to 0") would raise "I/O operation on closed file".

# The tests' own callbacks, which the configs they train with name: in the test modules and in the
# probe modules some tests write. A config may name modules outside imagetx, lightning and torch only
# where IMAGETX_CONFIG_IMPORTS lists them (imagetx/cli/config_guard.py), as a user lists theirs; set in
# the environment, so that the training processes a test starts inherit it.
PROBE_MODULES = ("ddp_probe", "grow_probe", "stop_callbacks")
os.environ["IMAGETX_CONFIG_IMPORTS"] = ",".join([*sorted(path.stem for path in Path(__file__).parent.rglob("test_*.py")),
                                     *PROBE_MODULES])

# Tiny tensors on two shared cores: intra-op threads only add synchronisation cost
# (one backward pass of a tiny model ran far slower with 2 threads under load).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(1234)
    yield


@pytest.fixture
def no_cifar_download(monkeypatch):
    """Make torchvision's CIFAR-10 download fail at once, as without a network: no test may
    ever reach the internet (URLError is an OSError, which is what a dead network raises)."""
    import urllib.error

    import torchvision.datasets.cifar as cifar

    def offline(*args, **kwargs):
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(cifar, "download_and_extract_archive", offline)


@pytest.fixture
def clean_wandb_env(monkeypatch, tmp_path):
    """No W&B key, no WANDB_* settings, HOME in tmp_path (so no ~/.netrc key either).

    imagetx.training.tracking writes WANDB_MODE / WANDB_SILENT into os.environ itself; setenv before
    delenv makes monkeypatch remember the original state, so whatever the code under test
    sets is undone after the test instead of leaking into later tests.
    """
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_SILENT", "WANDB_DIR", "WANDB_DISABLED",
                 "IMAGETX_DEBUG", "IMAGETX_DATA"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def data_root(tmp_path):
    """npz shards of 12 training images (val_size 2 leaves 10: 5 batches of 2 per epoch)."""
    root = tmp_path / "data"
    write_cifar_npz(root, train_sizes=(6, 6))
    return root
