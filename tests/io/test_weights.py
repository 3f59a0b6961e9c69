"""The weights folder (imagetx/io/weights.py: model.safetensors + config.json) and imagetx.export:
round trips from a training checkpoint, and folders that do not fit the model they describe."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import (TINY, TINY_TRAIN_MODEL, one_error_line, random_images, random_labels, tiny_config, tiny_model,
                     weights_checkpoint, write_train_config)
from imagetx import (CheckpointError, ImageTransformer, ModelConfig, from_pretrained, load_model, push_to_hub,
                     save_pretrained)
from imagetx.io.checkpoint import imagetx_metadata
from imagetx.io.older import as_reading, current_names, older_state
from imagetx.io.weights import FORMAT_VERSION, write_weights
from imagetx.model.superres import build_model, downsample_area
from imagetx.evaluate import main as evaluate_main
from imagetx.export import main as export_main
from imagetx.sample import main as sample_main
from imagetx.train import main as train_main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_training_checkpoint_exported_in_fp32_and_bf16_scores_as_the_checkpoint(tmp_path, capsys, data_root):
    run_dir = tmp_path / "run"
    train_main(["--config", str(write_train_config(tmp_path / "c.yaml", run_dir, data_root, 3)),
                "--wandb", "disabled"])
    last = run_dir / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    exported = {}
    for dtype in ("fp32", "bf16"):
        export_main(["--ckpt", str(last), "--out", str(tmp_path / dtype), "--dtype", dtype])
        summary = last_json(capsys)
        exported[dtype] = tmp_path / dtype
        assert sorted(p.name for p in exported[dtype].iterdir()) == ["README.md", "config.json", "model.safetensors"]
        assert summary["dtype"] == dtype and summary["ckpt"] == str(last)
        stored = {str(t.dtype) for t in load_file(exported[dtype] / "model.safetensors").values()}
        assert stored == {"torch.float32" if dtype == "fp32" else "torch.bfloat16"}, stored
    assert (exported["bf16"] / "model.safetensors").stat().st_size < \
        0.6 * (exported["fp32"] / "model.safetensors").stat().st_size

    trained = load_model(last)
    images = random_images(4, 32, seed=11)
    with torch.no_grad():
        expected = trained.bits_per_dim(images)
        assert torch.equal(load_model(exported["fp32"]).bits_per_dim(images), expected)
        from_bf16 = load_model(exported["bf16"])
        assert next(from_bf16.parameters()).dtype == torch.float32
        gap = (from_bf16.bits_per_dim(images) - expected).abs().max().item()
    assert 0 < gap < 0.01, gap  # bf16 rounds the weights (so not 0), by little

    # the commands take the folder where they take the checkpoint, and score it the same
    scores = {}
    for name, path in [("ckpt", last), *exported.items()]:
        evaluate_main(["--ckpt", str(path), "--data.root", str(data_root), "--split", "val", "--val_size", "2",
                       "--device", "cpu"])
        scores[name] = last_json(capsys)["bpd"]
    assert scores["fp32"] == scores["ckpt"] and abs(scores["bf16"] - scores["ckpt"]) < 0.01, scores
    for name in ("ckpt", "fp32"):
        sample_main(["--ckpt", str(last if name == "ckpt" else exported["fp32"]), "--count", "2", "--seed", "3",
                     "--out", str(tmp_path / f"samples-{name}"), "--device", "cpu"])
    assert (tmp_path / "samples-ckpt" / "generate.png").read_bytes() == \
        (tmp_path / "samples-fp32" / "generate.png").read_bytes()


@pytest.mark.parametrize("overrides", [
    dict(),
    dict(head="dmol", attention="local_2d", num_classes=3, position_encoding="learned", norm="pre"),
    dict(image_size=8, encoder_layers=1, low_res_size=2, attention="local_2d", query_block_shape=(2, 6),
         cell_remainder_input=True),
], ids=["plain", "dmol-2d-classes", "super-resolution"])
def test_save_pretrained_then_from_pretrained(tmp_path, overrides):
    model = tiny_model(seed=2, **overrides)
    kwargs = {}
    if model.config.num_classes:
        kwargs["labels"] = random_labels(2, model.config.num_classes)
    if model.config.superres:
        kwargs["low_res"] = random_images(2, model.config.superres.low_res_size, seed=8)
    images = random_images(2, model.config.image_size, seed=7)
    save_pretrained(model, tmp_path / "weights")
    loaded = from_pretrained(tmp_path / "weights")
    assert type(loaded) is type(model) and loaded.config == model.config and not loaded.training
    config = json.loads((tmp_path / "weights" / "config.json").read_text())
    assert config == {"format_version": FORMAT_VERSION, **model.config.to_dict()}
    card = (tmp_path / "weights" / "README.md").read_text()  # the Hub's model card, its metadata first
    assert card.startswith("---\n") and "library_name: imagetx" in card and "license: mit" in card
    with torch.no_grad():
        assert torch.equal(loaded.nll(images, **kwargs), model.nll(images, **kwargs))
        # a differently seeded model scores differently: the weights really came from the folder
        assert not torch.equal(tiny_model(seed=3, **overrides).nll(images, **kwargs), model.nll(images, **kwargs))
    assert not list((tmp_path / "weights").glob(".*"))  # no temporary files left


def test_files_written_before_the_config_had_sections_load_as_written(tmp_path):
    """A weights folder of format_version 1 and a checkpoint of format 1 hold the config on one level
    (``attention`` the kind, ``encoder_layers`` 0 for a plain decoder): both load as the model they
    describe."""
    flat = {**TINY, "head": "dmol", "image_size": 8, "attention": "local_2d", "query_block_shape": [2, 2],
            "encoder_layers": 1, "low_res_size": 4, "cell_remainder_input": True, "exact_box_means": True}
    model = tiny_model(seed=3, **flat)
    save_pretrained(model, tmp_path / "weights")
    (tmp_path / "weights" / "config.json").write_text(json.dumps({"format_version": 1, **flat}))
    torch.save(weights_checkpoint(model, {"format": 1, "model_config": flat}), tmp_path / "old.ckpt")
    images, low_res = random_images(2, 8, seed=1), random_images(2, 4, seed=2)
    for path in (tmp_path / "weights", tmp_path / "old.ckpt"):
        loaded = load_model(path)
        assert loaded.config == model.config and loaded.config.superres.exact_box_means
        with torch.no_grad():
            assert torch.equal(loaded.nll(images, low_res=low_res), model.nll(images, low_res=low_res))


# ----- folders that do not fit the model they describe ------------------------------------

def damaged_folder(tmp_path, damage):
    folder = tmp_path / "weights"
    save_pretrained(tiny_model(image_size=32, head="dmol", query_block_length=64), folder)
    tensors = load_file(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    name = sorted(tensors)[0]
    if damage == "missing tensor":
        del tensors[name]
    elif damage == "extra tensor":
        tensors["layers.7.attention.bonus"] = torch.zeros(3)
    elif damage == "misshapen tensor":
        tensors[name] = torch.zeros(*tensors[name].shape[:-1], tensors[name].shape[-1] + 1)
    elif damage == "unknown field":
        config["d_modle"] = 16
    elif damage == "newer format":
        config["format_version"] = FORMAT_VERSION + 1
    elif damage == "no config.json":
        (folder / "config.json").unlink()
    elif damage == "corrupt safetensors":
        (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    if damage in ("missing tensor", "extra tensor", "misshapen tensor"):
        save_file(tensors, folder / "model.safetensors")
    if damage in ("unknown field", "newer format"):
        (folder / "config.json").write_text(json.dumps(config))
    return folder, name


NEEDLES = {"missing tensor": "missing tensor(s) {name}", "extra tensor": "unexpected tensor(s) layers.7.attention.bonus",
           "misshapen tensor": "wrong tensor(s): {name} is", "unknown field": "d_modle",
           "newer format": f"format_version {FORMAT_VERSION + 1}", "no config.json": "has no config.json",
           "corrupt safetensors": "model.safetensors cannot be read"}


@pytest.mark.parametrize("damage", sorted(NEEDLES))
@pytest.mark.parametrize("command", ["load_model", "evaluate", "sample"])
def test_a_folder_that_does_not_fit_is_named_in_one_line(tmp_path, capsys, data_root, command, damage):
    folder, name = damaged_folder(tmp_path, damage)
    needle = NEEDLES[damage].format(name=name)
    if command == "load_model":
        with pytest.raises(CheckpointError) as info:
            load_model(folder)
        message = str(info.value)
    elif command == "evaluate":
        message = one_error_line(capsys, evaluate_main, ["--ckpt", str(folder), "--data.root", str(data_root),
                                                         "--split", "val", "--val_size", "2", "--device", "cpu"])
    else:
        message = one_error_line(capsys, sample_main, ["--ckpt", str(folder), "--out", str(tmp_path / "o"),
                                                       "--device", "cpu"])
    assert str(folder) in message and needle in message, message
    assert not (tmp_path / "o").exists()


def test_load_model_reads_local_paths_only(tmp_path):
    with pytest.raises(CheckpointError, match="someone/imagetx-cifar10 does not exist"):
        load_model("someone/imagetx-cifar10")  # not a local path: refused, never fetched
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_model(tmp_path)  # an empty folder


def test_a_hub_repository_is_fetched_by_huggingface_hub_then_read_as_a_folder(tmp_path, monkeypatch):
    """No network in the tests: the Hub's two downloads are stood in for by a local folder, and
    what from_pretrained does with what they return is checked (the folder's own checks apply)."""
    folder = tmp_path / "snapshot"
    model = tiny_model(seed=6)
    save_pretrained(model, folder)
    asked = []
    monkeypatch.setattr("imagetx.io.hub.snapshot_download",
                        lambda repo_id, allow_patterns, **options: asked.append((repo_id, allow_patterns, options))
                        or str(folder))
    loaded = from_pretrained("someone/imagetx-tiny", revision="main")
    assert asked == [("someone/imagetx-tiny", ["model.safetensors", "config.json"], {"revision": "main"})]
    images = random_images(2, 4)
    with torch.no_grad():
        assert torch.equal(loaded.nll(images), model.nll(images))
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="model.safetensors cannot be read"):
        from_pretrained("someone/imagetx-tiny")


def test_push_to_hub_uploads_the_saved_folder_in_one_commit(monkeypatch):
    """No network: huggingface_hub's HfApi is stood in for, and what it is asked to upload is read
    back as a folder."""
    model, calls = tiny_model(seed=7), []

    class FakeApi:
        def __init__(self, token=None):
            calls.append(("token", token))

        def create_repo(self, repo_id, private, exist_ok):
            calls.append(("create", repo_id, private, exist_ok))
            return type("Repo", (), {"repo_id": repo_id})

        def upload_folder(self, repo_id, folder_path, commit_message, revision, create_pr):
            calls.append(("upload", repo_id, sorted(p.name for p in Path(folder_path).iterdir()), revision))
            uploaded = load_model(folder_path)
            assert uploaded.config == model.config
            assert all(torch.equal(a, b) for a, b in zip(uploaded.state_dict().values(), model.state_dict().values()))
            return "https://huggingface.co/you/m/commit/1"

    monkeypatch.setattr("imagetx.io.hub.HfApi", FakeApi)
    assert push_to_hub(model, "you/m", token="t", branch="dev") == "https://huggingface.co/you/m/commit/1"
    assert calls == [("token", "t"), ("create", "you/m", None, True),
                     ("upload", "you/m", ["README.md", "config.json", "model.safetensors"], "dev")]


def test_a_hub_repository_that_cannot_be_fetched_is_one_error(tmp_path):
    # local_files_only: huggingface_hub looks in its cache (empty here) and never goes online
    with pytest.raises(CheckpointError, match="is not a local folder, and fetching it from the Hugging Face Hub failed"):
        from_pretrained("someone/imagetx-cifar10", local_files_only=True, cache_dir=tmp_path)


@pytest.mark.parametrize("name", ["pretrained/typo", "./typo", "typo", "a/b/c", "~/typo"])
def test_a_missing_local_path_is_refused_as_such_without_asking_the_hub(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pretrained").mkdir()  # the first folder of pretrained/typo exists here
    asked = []

    def offline(repo_id, **options):
        asked.append(repo_id)
        raise ConnectionError("no network in the tests")

    monkeypatch.setattr("imagetx.io.hub.snapshot_download", offline)
    with pytest.raises(CheckpointError, match=r"no such folder \(a local path"):
        from_pretrained(name)
    with pytest.raises(CheckpointError, match="no such folder"):
        from_pretrained(Path(name))
    assert asked == []
    with pytest.raises(CheckpointError, match="fetching it from the Hugging Face Hub failed"):
        from_pretrained("someone/typo")  # owner/name, owner no folder here: a Hub id (the control)
    assert asked == ["someone/typo"]


def test_the_readmes_shipped_model_names_open_from_any_folder(tmp_path, monkeypatch):
    """The README's ``from_pretrained("pretrained/completion")`` run outside the repository (no
    pretrained/ here) opens the shipped model, as the commands' --ckpt does, without the Hub; a
    mistyped shipped name is refused as a missing folder, not looked up on the Hub."""
    shipped = Path(__file__).resolve().parents[2] / "pretrained" / "completion"
    monkeypatch.chdir(tmp_path)
    asked = []
    monkeypatch.setattr("imagetx.io.hub.snapshot_download", lambda repo_id, **options: asked.append(repo_id))
    expected = load_model(shipped).state_dict()
    for opened in (from_pretrained("pretrained/completion"), load_model("pretrained/completion")):
        assert opened.state_dict().keys() == expected.keys()
        assert all(torch.equal(opened.state_dict()[name], expected[name]) for name in expected)
    with pytest.raises(CheckpointError, match="no such folder"):
        from_pretrained("pretrained/completoin")
    assert asked == []


def test_resume_from_a_weights_folder_is_refused(tmp_path, capsys, data_root):
    folder = tmp_path / "weights"
    save_pretrained(tiny_model(image_size=32, head="dmol"), folder)
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, 2)
    line = one_error_line(capsys, train_main, ["--config", str(config), "--wandb", "disabled",
                                               "--resume", str(folder)])
    assert str(folder) in line and "is a folder" in line and "last.ckpt" in line, line


def test_export_errors_are_one_line(tmp_path, capsys):
    line = one_error_line(capsys, export_main, ["--ckpt", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "w")])
    assert "nope.ckpt does not exist" in line, line
    assert not (tmp_path / "w").exists()  # nothing written for a checkpoint that cannot be read
    ckpt, taken = tmp_path / "model.ckpt", tmp_path / "a-file"
    model = tiny_model()  # the model's configuration and weights, no training state
    torch.save(weights_checkpoint(model), ckpt)
    taken.write_text("")
    line = one_error_line(capsys, export_main, ["--ckpt", str(ckpt), "--out", str(taken)])
    assert "a-file" in line and "--out" in line, line
    line = one_error_line(capsys, export_main, ["--ckpt", str(ckpt), "--out", str(tmp_path / "w"), "--dtype", "fp8"])
    assert "dtype" in line, line


def test_export_into_a_folder_with_files_of_its_names_needs_force_and_lists_what_it_wrote(tmp_path, capsys):
    """A folder holding the user's own README.md and config.json: refused in one line naming
    --force, nothing touched; with --force the weights and config are replaced, the user's card is
    kept, and the summary lists exactly the files written."""
    ckpt, out = tmp_path / "model.ckpt", tmp_path / "myproj"
    torch.save(weights_checkpoint(tiny_model()), ckpt)
    out.mkdir()
    (out / "README.md").write_text("my project\n")
    (out / "config.json").write_text('{"mine": true}\n')
    line = one_error_line(capsys, export_main, ["--ckpt", str(ckpt), "--out", str(out)])
    assert str(out / "config.json") in line and "--force" in line and "README.md" not in line, line
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json"]
    assert (out / "config.json").read_text() == '{"mine": true}\n'
    export_main(["--ckpt", str(ckpt), "--out", str(out), "--force"])
    summary = last_json(capsys)
    assert summary["files"] == [str(out / "model.safetensors"), str(out / "config.json")], summary
    assert summary["bytes"] == sum((out / name).stat().st_size for name in ("model.safetensors", "config.json"))
    assert (out / "README.md").read_text() == "my project\n" and load_model(out).config == tiny_model().config
    fresh = tmp_path / "fresh"  # an empty or new folder: all three, no --force needed
    export_main(["--ckpt", str(ckpt), "--out", str(fresh)])
    assert last_json(capsys)["files"] == [str(fresh / name) for name in ("model.safetensors", "config.json",
                                                                         "README.md")]


def test_export_switches_exact_box_means_on_for_a_trained_super_resolution_model(tmp_path, capsys):
    """The setting has no tensors: the exported weights are the checkpoint's, the bounds come with
    the configuration (docs/model.md §6), and a model without the cell sums is refused in one line."""
    fields = dict(head="dmol", image_size=8, encoder_layers=1, low_res_size=4, cell_remainder_input=True)
    model = tiny_model(seed=3, **fields)
    ckpt = tmp_path / "model.ckpt"
    torch.save(weights_checkpoint(model), ckpt)
    export_main(["--ckpt", str(ckpt), "--out", str(tmp_path / "bounded"), "--exact_box_means", "true"])
    assert last_json(capsys)["exact_box_means"] is True
    bounded = load_model(tmp_path / "bounded")
    assert bounded.config.superres.exact_box_means and not model.config.superres.exact_box_means
    for name, value in model.state_dict().items():
        assert torch.equal(bounded.state_dict()[name], value), name
    images = random_images(2, 8, seed=4)
    low_res = downsample_area(images, 4)
    with torch.no_grad():
        assert (bounded.bits_per_dim(images, low_res=low_res) < model.bits_per_dim(images, low_res=low_res)).all()
    torch.save(weights_checkpoint(tiny_model(**{**fields, "cell_remainder_input": False})), ckpt)
    line = one_error_line(capsys, export_main, ["--ckpt", str(ckpt), "--out", str(tmp_path / "refused"),
                                                "--exact_box_means", "true"])
    assert "exact_box_means" in line and "cell_remainder_input" in line, line
    assert not (tmp_path / "refused").exists()


def test_export_refuses_exact_box_means_for_a_model_without_a_low_resolution_input(tmp_path, capsys):
    ckpt = tmp_path / "model.ckpt"
    torch.save(weights_checkpoint(tiny_model(seed=3, head="dmol")), ckpt)
    for value in ("true", "false"):
        line = one_error_line(capsys, export_main, ["--ckpt", str(ckpt), "--out", str(tmp_path / "refused"),
                                                    "--exact_box_means", value])
        assert "exact_box_means" in line and "superres" in line, line
        assert not (tmp_path / "refused").exists()


def test_a_run_driven_from_python_with_path_arguments_writes_a_checkpoint_load_model_opens(tmp_path, data_root):
    # ImageDataModule(root=Path(...)) from Python: its hyper-parameters go into the checkpoint,
    # which load_model reads weights-only, so they must hold a str, never a PosixPath.
    import lightning as L

    from imagetx.data.datamodule import ImageDataModule
    from imagetx.training.module import ImageTransformerModule

    module = ImageTransformerModule(ModelConfig(**TINY_TRAIN_MODEL), warmup_steps=2)
    data = ImageDataModule(root=data_root, batch_size=2, val_size=2, download=False, image_size=32, num_classes=0)
    trainer = L.Trainer(default_root_dir=tmp_path / "run", accelerator="cpu", devices=1, max_steps=2,
                        limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    [ckpt] = (tmp_path / "run").rglob("*.ckpt")  # Lightning's own checkpoint of the run
    loaded = load_model(ckpt)
    stored = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert stored["global_step"] == 2 and stored["datamodule_hyper_parameters"]["root"] == str(data_root)
    assert loaded.config == module.config
    images = random_images(2, 32, seed=4)
    with torch.no_grad():
        assert torch.equal(loaded.nll(images), module.model.eval().nll(images))


@pytest.mark.parametrize("reading", ["cell_add", "cross_attention"])
@pytest.mark.parametrize("form", ["decoder beside", "in the layer", "the layer's reading", "the model the decoder"])
def test_super_resolution_weights_under_their_older_names_load_as_today_s(tmp_path, form, reading):
    """A super-resolution model's weights were first named as the decoder's under ``decoder.`` and
    its readings of the encoder beside it (readings.0.cell_add...), then as the decoder's own, each
    layer's reading inside the layer (layers.0.cell_add...), then under the layer's reading
    (layers.0.reading.cell_add...), then with the cell adds the model's (cell_adds.0...) and
    cross-attention the layer's (layers.0.cross_attn...); today the model composes the decoder, its
    tensors under ``decoder.`` (decoder.layers.0.cross_attn...). Folders of each older form (the
    shipped super-resolution models' among them) load, and score as the model they were written from."""
    model = tiny_model(seed=3, image_size=8, head="dmol", encoder_layers=1, low_res_size=4, low_res_reading=reading,
                       cell_remainder_input=True, n_layers=2, norm="post")
    older = {}
    for name, value in model.state_dict().items():
        name = name.removeprefix("decoder.") if form == "the model the decoder" else as_reading(name)
        if form == "in the layer":
            name = name.replace(".reading.", ".")
        elif form == "decoder beside" and ".reading." in name:
            index, rest = name.removeprefix("layers.").split(".reading.")
            name = f"readings.{index}.{rest}"
        elif form == "decoder beside" and not name.startswith(("encoder.", "cell_remainder.")):
            name = f"decoder.{name}"
        older[name] = value
    part = "cell_add.proj.weight" if reading == "cell_add" else "cross_attn.q.weight"
    old_name = {"decoder beside": f"readings.1.{part}", "in the layer": f"layers.1.{part}",
                "the layer's reading": f"layers.1.reading.{part}",
                "the model the decoder": "cell_adds.1.proj.weight" if reading == "cell_add" else f"layers.1.{part}"}[form]
    assert old_name in older and "encoder.embedding.table.weight" in older
    write_weights(tmp_path / "older", older, model.config)
    loaded = load_model(tmp_path / "older")
    images = random_images(2, 8, seed=4)
    with torch.no_grad():
        assert torch.equal(loaded.nll(images, low_res=downsample_area(images, 4)),
                           model.nll(images, low_res=downsample_area(images, 4)))
    assert sorted(current_names(older, model)) == sorted(model.state_dict())  # today's names
    assert list(current_names(model.state_dict(), model)) == list(model.state_dict())  # today's names stay as they are


def tiny_of_kind(kind: str) -> ImageTransformer:
    if kind == "own width":  # 3 heads of 12 over d_model 16: no projection's rows divide by d_model / heads
        config = tiny_config(head="dmol", n_layers=2, n_heads=3)
        config = dataclasses.replace(config, attention=dataclasses.replace(config.attention, head_size=12)).validate()
        torch.manual_seed(3)
        return build_model(config).eval()
    extra = dict(image_size=8, encoder_layers=1, low_res_size=4) if kind == "superres" else {}
    return tiny_model(seed=3, head="dmol", n_layers=2, **extra)


@pytest.mark.parametrize("kind", ["decoder", "superres", "own width"])
def test_weights_in_the_older_projection_layout_load_as_today_s(tmp_path, kind):
    """Folders written before the (B, h, T, e) layout (every shipped one): attention projections
    named to_qkv / to_kv / to_q / to_out, the fused ones' output features in (head, part, e)
    order. They load with today's names and order, and score as the model they were written from."""
    model = tiny_of_kind(kind)
    older = older_state(model)
    assert "layers.1.self_attn.to_qkv.weight" in older and "layers.1.self_attn.qkv.weight" not in older
    fused = older["layers.1.self_attn.to_qkv.weight"]
    decoder = "decoder." if kind == "superres" else ""
    assert not torch.equal(fused, model.state_dict()[f"{decoder}layers.1.self_attn.qkv.weight"])  # reordered
    if kind == "superres":
        assert "layers.0.reading.cross_attn.to_kv.weight" in older  # the form the codec's fingerprint hashes
    today = current_names(older, model)
    assert list(today) == list(model.state_dict())
    assert all(torch.equal(today[name], value) for name, value in model.state_dict().items())
    write_weights(tmp_path / "older", older, model.config)
    loaded = load_model(tmp_path / "older")
    images = random_images(2, 8 if kind == "superres" else model.config.image_size, seed=4)
    low_res = downsample_area(images, 4) if kind == "superres" else None
    with torch.no_grad():
        assert torch.equal(loaded.nll(images, low_res=low_res), model.eval().nll(images, low_res=low_res))


def test_an_older_projection_of_another_shape_is_named_in_one_line(tmp_path):
    model = tiny_of_kind("decoder")
    older = older_state(model)
    older["layers.1.self_attn.to_qkv.weight"] = older["layers.1.self_attn.to_qkv.weight"][:-1]
    write_weights(tmp_path / "older", older, model.config)
    with pytest.raises(CheckpointError, match=r"layers\.1\.self_attn\.qkv\.weight") as error:
        load_model(tmp_path / "older")
    assert "\n" not in str(error.value)


def test_an_exported_card_says_what_training_recorded_and_a_shipped_card_is_kept(tmp_path, capsys):
    """A checkpoint's card carries its steps, data and val bits/dim (from the state of training's
    ModelCheckpoint, monitoring val/bpd, as Lightning keeps it); a shipped model exported keeps its
    own card rather than the generic one."""
    model = tiny_model(seed=8)
    checkpoint = weights_checkpoint(model)
    checkpoint["imagetx"]["images_seen"] = 4800
    checkpoint.update(global_step=600, datamodule_hyper_parameters={"source": "cifar10", "val_size": 5000},
                      callbacks={"ModelCheckpoint{'monitor': 'val/bpd', 'mode': 'min'}": {
                          "monitor": "val/bpd", "current_score": torch.tensor(3.51234),
                          "best_model_score": torch.tensor(3.50012)}})
    torch.save(checkpoint, tmp_path / "run.ckpt")
    export_main(["--ckpt", str(tmp_path / "run.ckpt"), "--out", str(tmp_path / "weights")])
    card = (tmp_path / "weights" / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: imagetx" in card and "- cifar10" in card
    for fact in ("steps: 600 (4,800 images seen)", "data: cifar10, val: the last 5,000 training images",
                 "val bits/dim at the last validation: 3.5123", "best val bits/dim of the run: 3.5001"):
        assert f"- {fact}\n" in card, (fact, card)
    shipped = Path(__file__).resolve().parents[2] / "pretrained" / "completion"
    export_main(["--ckpt", str(shipped), "--out", str(tmp_path / "shipped")])
    assert (tmp_path / "shipped" / "README.md").read_text() == (shipped / "README.md").read_text()
    capsys.readouterr()
