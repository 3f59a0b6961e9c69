"""The shipped models in pretrained/ (their model cards: pretrained/*/README.md).

Each loads through the safe-weights path, scores the 32 fixed val images of
tests/assets/cifar10_val_first32.npz (the first 32 of the last 5,000 CIFAR-10 training images,
``train-4.npz[5000:5032]`` of ../shared/cifar10, with their labels) within 0.01 bits/dim of
the figure recorded here when it was exported, and does its job: a completion keeps its given
rows bit-identical, a super-resolved sample box-averages back to its 8×8 input exactly. Each GPU
model's continuation passes ``--resume``'s checks under its lease preset. Each folder holds only
what a user loads; a model's training history lives beside pretrained/ in lineage/NAME/, which
its card names (ops/lease_cards.py)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from helpers import ASSETS
from imagetx.model.superres import downsample_area
from imagetx.model.scoring import evaluate
from imagetx.sample import main as sample_main
from imagetx.model.sampler import sample
from imagetx.io.load import load_model
from imagetx.model.config import ModelConfig
from imagetx.training.resume import checkpoint_to_resume
from ops.lease_cards import LINEAGE, card, lineage_folder

REPO = Path(__file__).resolve().parents[2]
VAL_IMAGES = ASSETS / "cifar10_val_first32.npz"

# bits/dim over the 32 fixed val images, measured with `evaluate` (float32, CPU) when the weights
# were exported, or for cifar10_gpu and superres_gpu when their lease's weights came home
RECORDED_BPD = {"cifar10_gpu": 2.9841, "completion": 3.3874, "superres": 3.0688, "superres_gpu": 2.8997}
# A recorded figure is the same weights on the same images: only float summation order may
# differ between machines, far below this.
BPD_TOLERANCE = 0.01


def val_images() -> torch.Tensor:
    with np.load(VAL_IMAGES) as arrays:
        return torch.from_numpy(arrays["images"])


@pytest.fixture(scope="module", params=sorted(RECORDED_BPD))
def shipped(request):
    return request.param, load_model(REPO / "pretrained" / request.param)


@pytest.mark.slow
def test_each_shipped_model_scores_the_bits_per_dim_recorded_for_it(shipped):
    name, model = shipped
    assert (REPO / "pretrained" / name / "model.safetensors").is_file()
    assert (REPO / "pretrained" / name / "README.md").is_file(), "every shipped model has a model card"
    bpd = evaluate(model, val_images(), None, progress=False)["bpd"]
    assert abs(bpd - RECORDED_BPD[name]) <= BPD_TOLERANCE, f"{name}: {bpd:.4f} against {RECORDED_BPD[name]}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cifar10_gpu", "completion"])
def test_a_completion_keeps_the_given_rows_bit_identical(name):
    model = load_model(REPO / "pretrained" / name)
    images, rows = val_images()[:2], 16
    completed = sample(model, 2, prefix=images, given_rows=rows, generator=torch.Generator().manual_seed(0))
    assert torch.equal(completed[:, :rows], images[:, :rows])
    assert not torch.equal(completed[:, rows:], images[:, rows:])  # the rest is the model's own


@pytest.mark.slow
@pytest.mark.parametrize("name", ["superres", "superres_gpu"])
def test_a_super_resolved_sample_averages_back_to_its_input_exactly(name):
    model = load_model(REPO / "pretrained" / name)
    assert model.config.superres.exact_box_means  # each value restricted to what keeps its cell's mean
    size = model.config.superres.low_res_size
    low_res = downsample_area(val_images()[:2], size)
    temperatures = (1.0, 0.8, 0.0)  # one batch: each of the two inputs at each temperature
    drawn = sample(model, 6, low_res=low_res.repeat(3, 1, 1, 1), temperature=[t for t in temperatures for _ in low_res],
                   generator=torch.Generator().manual_seed(0))
    assert torch.equal(downsample_area(drawn, size), low_res.repeat(3, 1, 1, 1))
    drawn = drawn.view(3, 2, *drawn.shape[1:])  # (temperature, input, H, W, 3)
    assert not torch.equal(drawn[0], drawn[2]) and not torch.equal(drawn[1], drawn[2])  # drawn, not the fixed mode


@pytest.mark.parametrize("task", ["complete", "superres"])
def test_try_it_commands_run_on_your_own_image(tmp_path, capsys, task):
    # README, "Try it without training": a photo of any size in, a grid out
    photo = tmp_path / "photo.png"
    Image.fromarray(val_images()[3].repeat_interleave(3, 0).repeat_interleave(3, 1).numpy()).save(photo)  # 96×96
    name = "completion" if task == "complete" else "superres"
    sample_main(["--ckpt", str(REPO / "pretrained" / name), "--task", task, "--images", str(photo),
                 "--count", "1", "--samples", "2", "--out", str(tmp_path / "out")])
    assert list((tmp_path / "out").glob("*.png")), "the grid was written"


def test_bf16_autocast_scores_the_completion_model_close_to_float32(monkeypatch):
    """Under bf16-mixed the head and the layers that read raw pixel values run in float32
    (``full_precision_linear``, imagetx/model/heads.py). The shipped completion model's bits/dim under
    CPU bf16 autocast, on the 32 fixed val images: 0.0026 above float32 for the model shipped 2026-11-26 (0.0028 and
    0.0023 for the two before it; the issue's target was 0.002: the rest is bfloat16 hidden states,
    which carry intensities linearly). Negative controls: the head's projection left to autocast
    (bfloat16) adds 0.0031 (0.0057 above float32 in all: over the bound); the pixel embedding too, 0.0077."""
    model = load_model(REPO / "pretrained" / "completion")
    images = val_images()

    def bpd(autocast: bool) -> float:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return float(model.bits_per_dim(images).mean())

    float32, mixed = bpd(False), bpd(True)
    assert abs(mixed - float32) <= 0.004, f"bf16 autocast {mixed:.4f} against float32 {float32:.4f}"
    autocast_linear = lambda proj, x: proj(x)  # noqa: E731
    monkeypatch.setattr(model.head, "forward", lambda hidden: model.head.proj(hidden))
    bfloat16_head = bpd(True)
    assert bfloat16_head - mixed > 0.001, f"bf16 head {bfloat16_head:.4f} against {mixed:.4f} with a float32 head"
    assert bfloat16_head - float32 > 0.004, "a bfloat16 head is over the bound the float32 one keeps"
    monkeypatch.setattr("imagetx.model.heads.full_precision_linear", autocast_linear)
    assert bpd(True) - mixed > 0.004, "bfloat16 pixel embedding and head"


def test_each_model_card_carries_the_hubs_metadata(shipped):
    """The card's front matter, as the Hugging Face Hub reads it: library, licence, data and the
    val bits/dim of the card's own table."""
    from huggingface_hub import ModelCard

    name, _ = shipped
    card = ModelCard.load(REPO / "pretrained" / name / "README.md")
    assert card.data.library_name == "imagetx" and card.data.license == "mit" and card.data.datasets == ["cifar10"]
    (result,) = card.data.eval_results
    assert result.metric_type == "bits_per_dim"
    assert f"**{result.metric_value}**" in card.text  # the figure the card's table states


# The preset each GPU model's leases train with (ops/README.md; CONFIG in ops/gpu_lease.sh).
LEASE_PRESETS = {"cifar10_gpu": "cifar10_recipe.yaml", "superres_gpu": "superres_gpu.yaml"}


@pytest.mark.parametrize("name", sorted(LEASE_PRESETS))
def test_each_shipped_continuation_resumes_with_its_preset(tmp_path, name):
    """The next lease goes on from the repository's continuation: it must pass --resume's checks
    under today's code and preset. cifar10_gpu's lease 2 lost a call to a KeyError here (a field
    added to ModelConfig after the continuation was written); this finds such a thing in CI."""
    preset = yaml.safe_load((REPO / "configs" / LEASE_PRESETS[name]).read_text())
    config = ModelConfig.from_dict(preset["model"]["config"])
    continuation = lineage_folder(REPO / "pretrained" / name) / "continuation"
    assert Path(checkpoint_to_resume(str(continuation), tmp_path, config)).is_file()


# What a user loads from pretrained/NAME/: the weights, their config, the card and its pictures.
USER_FILES = {"model.safetensors", "config.json", "README.md"}


def shipped_folders() -> list[Path]:
    return sorted(path for path in (REPO / "pretrained").iterdir() if path.is_dir())


def test_each_model_folder_holds_only_what_a_user_loads():
    """The wheel carries pretrained/ as it is (setup.py): no lineage, logs or continuation in it."""
    assert {path.name for path in shipped_folders()} >= set(RECORDED_BPD)
    assert {path.name for path in (REPO / "pretrained").iterdir() if path.is_file()} == {"README.md"}
    for folder in shipped_folders():
        names = {path.name for path in folder.iterdir()}
        assert USER_FILES <= names, f"{folder.name}: {sorted(USER_FILES - names)} missing"
        others = sorted(name for name in names - USER_FILES if not name.endswith(".png"))
        assert not others, f"pretrained/{folder.name} holds {others}: training history goes in {LINEAGE}/{folder.name}/"
        assert all(path.is_file() for path in folder.iterdir()), f"pretrained/{folder.name} holds a folder"


def test_each_lineage_folder_is_a_shipped_models_and_its_card_names_it():
    lineages = sorted(path for path in (REPO / LINEAGE).iterdir() if path.is_dir())
    assert {path.name for path in lineages} >= set(LEASE_PRESETS)  # every GPU model's leases
    for folder in lineages:
        model = REPO / "pretrained" / folder.name
        assert model.is_dir(), f"{LINEAGE}/{folder.name}/ has no model in pretrained/"
        assert lineage_folder(model) == folder
        assert f"{LINEAGE}/{folder.name}/" in (model / "README.md").read_text(), \
            f"pretrained/{folder.name}/README.md does not name {LINEAGE}/{folder.name}/"
        assert (folder / "continuation" / "continuation.json").is_file()


@pytest.mark.parametrize("name", sorted(LEASE_PRESETS))
def test_each_lease_trained_models_card_is_what_its_lineage_writes(name):
    """ops/lease_record.py writes the card from lineage/NAME/lineage.json: the committed card is that
    card, so that the next lease's card changes only by what the lease adds."""
    model = REPO / "pretrained" / name
    lineage = json.loads((lineage_folder(model) / "lineage.json").read_text())
    assert [lease["lease"] for lease in lineage] == list(range(1, len(lineage) + 1))
    for lease in lineage:
        assert (lineage_folder(model) / "leases" / f"lease_{lease['lease']}" / "metrics.csv").is_file()
    config = json.loads((model / "config.json").read_text())
    assert (model / "README.md").read_text() == card(name, config, lineage)


def test_the_superres_preset_starts_from_the_completion_models_continuation():
    """configs/pretrained_superres.yaml's init_from (run from the repository's top) is a packed
    continuation in the completion model's lineage folder."""
    preset = yaml.safe_load((REPO / "configs" / "pretrained_superres.yaml").read_text())
    assert Path(preset["init_from"]) == lineage_folder(Path("pretrained") / "completion") / "continuation"
    assert (REPO / preset["init_from"] / "continuation.json").is_file()
