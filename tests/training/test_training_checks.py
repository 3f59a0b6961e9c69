"""Input checks that keep their guarantees without reading the device at every training step:
the data's values are checked once, as each split is read (``check_fits``); training steps on
that data check shapes and dtypes only (``log_prob(..., check=False)``); on any other data,
and for every API caller, values are checked as before."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from helpers import random_images, tiny_config, tiny_model
from imagetx.data.datamodule import ImageDataModule
from imagetx.training.module import ImageTransformerModule
from imagetx.data.sources import DataError, Pool, check_fits


def pool(labels, dtype=np.uint8) -> Pool:
    images = np.zeros((len(labels), 4, 4, 3), dtype=dtype)
    return Pool(images, np.asarray(labels, dtype=np.int64), 10, "--data.source folder --data.root DIR")


@pytest.mark.parametrize("labels", [[0, 10], [-1, 3]])
def test_labels_outside_the_classes_are_refused_when_the_data_is_read(labels):
    with pytest.raises(DataError, match=r"has labels -?\d+\.\.\d+, outside 0\.\.9"):
        check_fits(pool(labels), 4, 10)
    check_fits(pool(labels), 4, 0)  # an unconditional model reads no labels
    check_fits(pool([0, 9]), 4, 10)


def test_images_that_are_not_uint8_are_refused_when_the_data_is_read():
    with pytest.raises(DataError, match="holds int16 images, not uint8"):
        check_fits(pool([0, 1], dtype=np.int16), 4, 10)


def test_the_datamodule_vouches_for_labels_checked_against_the_models_classes():
    assert ImageDataModule(num_classes=10).values_checked_for(10)
    assert ImageDataModule(num_classes=None).values_checked_for(0)  # no labels read
    assert not ImageDataModule(num_classes=None).values_checked_for(10)  # labels never checked
    assert not ImageDataModule(num_classes=5).values_checked_for(10)


def test_with_check_false_only_shapes_and_dtypes_are_checked():
    model = tiny_model(num_classes=10)
    images, bad = random_images(2, 4), torch.tensor([3, 12])
    with pytest.raises(ValueError, match="labels span 3..12 outside 0..9"):
        model.log_prob(images, bad)
    with pytest.raises(IndexError):  # values unread: label 12 reaches the class embedding
        model.log_prob(images, bad, check=False)
    with pytest.raises(ValueError, match=r"labels have shape \(3,\); expected \(2,\)"):
        model.log_prob(images, torch.tensor([0, 1, 2]), check=False)
    with pytest.raises(ValueError, match="images are torch.float32"):
        model.log_prob(images.float(), torch.tensor([0, 1]), check=False)


def test_training_on_other_data_still_checks_every_batchs_labels():
    """A DataLoader not from ImageDataModule: its labels were never checked, so each step is."""
    module = ImageTransformerModule(tiny_config(num_classes=10), warmup_steps=1)
    batches = [{"images": image, "labels": torch.tensor(label)} for image, label in zip(random_images(2, 4), (3, 12))]
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ValueError, match="labels span 3..12 outside 0..9"):
        trainer.fit(module, DataLoader(batches, batch_size=2))
    assert not module.data_checked
