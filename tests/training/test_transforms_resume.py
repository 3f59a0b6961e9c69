"""Distribution augmentation through ``imagetx.train`` (issue 127): the transform ids reach the model's
embedding, and a run resumed mid-epoch and at an epoch's end ends bitwise as the uninterrupted one, as
tests/training/test_reliability_resume.py checks without transforms (same runs, same settings)."""

from __future__ import annotations

import pytest
import torch

from helpers import TINY_TRAIN_MODEL, with_changes
from imagetx import build_model
from imagetx.io.older import model_config
from test_reliability_resume import STEPS, assert_same_training_state, train

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

# Dropout and flips on as there, and the channel orders drawn (ids 0..5 of the 48 a model embeds).
AUGMENTED = dict(model={"dropout": 0.1, "num_transforms": 48}, data={"random_flip": True, "transforms": "channels"})


@pytest.fixture
def uninterrupted(tmp_path, data_root):
    return train(tmp_path, tmp_path / "straight", data_root, **AUGMENTED)


def test_the_drawn_ids_train_their_embeddings_only(uninterrupted):
    """Adam's first moment of the transform table is non-zero in rows 0..5 (the channel orders drawn) and
    exactly zero in the 42 rows never drawn: the ids in the batches are the ones the model read."""
    names = [name for name, _ in build_model(model_config(with_changes(TINY_TRAIN_MODEL, AUGMENTED["model"])))
             .named_parameters()]  # the optimiser's order (one group: no low-resolution input)
    moment = uninterrupted["optimizer_states"][0]["state"][names.index("transform_embedding.weight")]["exp_avg"]
    assert moment.shape == uninterrupted["state_dict"]["model.transform_embedding.weight"].shape == (48, 16)
    drawn = (moment != 0).any(dim=1)
    assert drawn[:6].all() and not drawn[6:].any()


@pytest.mark.parametrize("first_steps", [7, 10], ids=["mid-epoch", "at-an-epoch-end"])
def test_resume_with_transforms_matches_an_uninterrupted_run(tmp_path, data_root, uninterrupted, first_steps):
    run_dir = tmp_path / "extended"
    first = train(tmp_path, run_dir, data_root, max_steps=first_steps, **AUGMENTED)
    assert first["global_step"] == first_steps
    resumed = train(tmp_path, run_dir, data_root, extra=["--resume", "last"], **AUGMENTED)
    assert_same_training_state(resumed, uninterrupted)
    assert resumed["global_step"] == STEPS
