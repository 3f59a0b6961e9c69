"""Downsampled ImageNet's pickled batch files are data: one that would call a function when loaded
(issue 124: os.system on ``train`` and ``evaluate``) is refused in one line naming the npz form, the
call never made and the file left as it was; files pickled the ordinary way, as the official ones
were, still read at every protocol."""

from __future__ import annotations

import os
import pickle
import shlex

import numpy as np
import pytest

from helpers import one_error_line, tiny_model, write_train_config
from imagetx import save_pretrained
from imagetx.data.sources import load
from imagetx.evaluate import main as evaluate_main
from imagetx.train import main as train_main
from test_data_sources import SIDE, TINY, imagenet_entry, rgb_images, write_imagenet

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


class Touch:
    """Unpickled, runs ``touch MARKER`` through os.system: what a crafted batch file could do."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def plant(path, marker) -> bytes:
    """Overwrite the batch file ``path`` with one whose 'data' runs a command when unpickled."""
    entry = imagenet_entry(rgb_images(2), np.array([1, 2]))
    path.write_bytes(pickle.dumps({**entry, "data": Touch(marker)}))
    return path.read_bytes()


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_a_batch_file_that_would_run_code_is_refused_unrun(tmp_path, capsys, command):
    root, marker = tmp_path / "imagenet", tmp_path / "ran"
    write_imagenet(root, batches=(2, 2, 2), val=2)
    data = ["--data.source", "imagenet", "--data.root", str(root)]
    if command == "train":
        crafted = root / "train_data_batch_1"
        written = plant(crafted, marker)
        config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", root, 2, model=TINY,
                                    data={"source": "imagenet"})
        line = one_error_line(capsys, train_main, ["--config", str(config), "--wandb", "disabled"])
    else:
        crafted = root / "val_data"
        written = plant(crafted, marker)
        ckpt = tmp_path / "model"
        save_pretrained(tiny_model(head="dmol", image_size=SIDE, query_block_length=16), ckpt)
        line = one_error_line(capsys, evaluate_main, ["--ckpt", str(ckpt), "--split", "val", "--device", "cpu", *data])
    assert not marker.exists()  # the pickle's call was never made
    assert str(crafted) in line and "'posix.system'" in line and f"{crafted.name}.npz" in line, line
    assert crafted.read_bytes() == written


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_batch_files_pickled_the_ordinary_way_still_read(tmp_path, protocol):
    images = rgb_images(3)
    entry = imagenet_entry(images, np.array([0, 5, 999]))
    # labels as numpy integers too: numpy's scalars (and, at protocol 2, their bytes) in the pickle
    entry["labels"] = [np.int64(label) for label in entry["labels"]]
    for name in ("train_data_batch_1", "val_data"):
        (tmp_path / name).write_bytes(pickle.dumps(entry, protocol=protocol))
    read, labels = load("imagenet", tmp_path, "val")
    np.testing.assert_array_equal(read.numpy(), images)
    np.testing.assert_array_equal(labels.numpy(), [0, 5, 999])
