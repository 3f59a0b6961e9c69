"""A normal install (pip install ., not editable): the wheel holds the shipped models, the presets
and the console scripts, and the README's paths (pretrained/..., configs/...) find them from any
folder. .ci/run installs the wheel into a fresh environment and samples with it from outside the
repository."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imagetx.cli.shipped import resolve, resolve_config_args

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {"imagetx-train", "imagetx-evaluate", "imagetx-sample", "imagetx-export", "imagetx-demo"}


@pytest.mark.slow
def test_the_wheel_holds_the_shipped_models_the_presets_and_the_commands(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("imagetx-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    for model in ("completion", "superres"):
        for file in ("model.safetensors", "config.json", "README.md"):
            assert f"imagetx/pretrained/{model}/{file}" in names
    # the shipped models' training history (lineage/) stays in the repository
    assert not [name for name in names if name.startswith(("lineage/", "imagetx/lineage/"))]
    shipped = [name.split("/", 3)[-1] for name in names if name.startswith("imagetx/pretrained/") and name.count("/") > 2]
    assert shipped and all(name.endswith(".png") or name in ("model.safetensors", "config.json", "README.md")
                           for name in shipped), shipped
    presets = {p.name for p in (REPO / "configs").glob("*.yaml")}
    assert presets and {f"imagetx/configs/{name}" for name in presets} <= names
    assert {line.split(" = ")[0] for line in entry_points.splitlines() if " = " in line} >= COMMANDS


def test_the_readmes_paths_find_the_shipped_files_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Path(resolve("pretrained/completion"), "model.safetensors").is_file()
    assert resolve_config_args(["--config", "configs/quick.yaml"])[1] == str(REPO / "configs" / "quick.yaml")
    assert resolve_config_args(["--config=configs/quick.yaml"]) == [f"--config={REPO / 'configs' / 'quick.yaml'}"]
    assert resolve("pretrained/none") == "pretrained/none"  # no such model: left for the command to refuse
    (tmp_path / "pretrained" / "completion").mkdir(parents=True)  # a folder of the user's own wins
    assert resolve("pretrained/completion") == "pretrained/completion"
