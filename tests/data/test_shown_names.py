"""A file's name is a stranger's text: a message that names it shows a newline or a terminal escape
written out (issue 124), so that a folder's file cannot break the warning's line into lines of its
own or rewrite the terminal, and a printable name is shown as it is."""

from __future__ import annotations

import pytest
from PIL import Image

from helpers import one_error_line
from imagetx.cli.classes import class_names, described
from imagetx.data.sources import DataError, load
from imagetx.data.sources.folder import convert
from imagetx.evaluate import main as evaluate_main
from test_data_sources import SIDE, write_folder

# a newline and a line of its own, then the terminal's "clear the screen" escape
CRAFTED = "a\nerror: fake line \x1b[2J.png"
SHOWN = r"a\nerror: fake line \x1b[2J.png"


def test_the_skipped_files_warning_shows_escapes_in_one_line(tmp_path, capsys):
    root = tmp_path / "photos"
    write_folder(root, count=3, classes=())
    (root / CRAFTED).write_text("not a PNG")
    (root / "plain é.png").write_text("not a PNG either")
    load("folder", root, "train", val_size=1, image_size=SIDE)
    err = capsys.readouterr().err
    (warning,) = [line for line in err.splitlines() if line.startswith("warning:")]
    assert "skipped 2 of 5 image files" in warning and SHOWN in warning, warning
    assert "plain é.png" in warning  # printable names as they are
    assert "\x1b" not in err and "fake line" not in err.replace(warning, "")


def test_a_changed_folder_names_an_added_file_with_escapes_shown(tmp_path):
    root = tmp_path / "photos"
    write_folder(root, count=3, classes=())
    convert(root, SIDE)
    (root / CRAFTED).write_text("not a PNG")
    with pytest.raises(DataError) as info:
        convert(root, SIDE)
    message = str(info.value)
    assert "1 file(s) added" in message and SHOWN in message and "\n" not in message, message


def test_an_error_line_shows_a_given_name_with_escapes_written_out(tmp_path, capsys):
    line = one_error_line(capsys, evaluate_main, ["--ckpt", str(tmp_path / CRAFTED)])
    assert "does not exist" in line and r"\x1b[2J.png" in line and "\x1b" not in line, line


def test_a_folders_class_names_are_said_with_escapes_shown(tmp_path):
    for name in ("cats", CRAFTED.removesuffix(".png")):
        (tmp_path / name).mkdir()
        Image.new("RGB", (SIDE, SIDE)).save(tmp_path / name / "a.png")
    names = class_names("folder", str(tmp_path), 2)
    said = described([0, 1], names)
    assert "cats" in said and SHOWN.removesuffix(".png") in said and "\x1b" not in said and "\n" not in said, said


def test_compress_and_sample_name_a_given_picture_with_escapes_shown(tmp_path, capsys):
    """Their per-input lines printed a picture's name raw (noticed with issue 124's item 10)."""
    from imagetx import compress as compress_cli
    from imagetx.io.hub import save_pretrained
    from imagetx.sample import main as sample_main
    from helpers import random_images, tiny_model

    save_pretrained(tiny_model(seed=1, head="dmol"), tmp_path / "model")
    picture = tmp_path / CRAFTED
    Image.fromarray(random_images(1, 4, seed=3).numpy()[0]).save(picture, format="PNG")
    compress_cli.main(["--portable", "false", str(picture), "--ckpt", str(tmp_path / "model"), "--out",
                       str(tmp_path / "one.itx"), "--progress", "false", "--compare", "true"])
    sample_main(["--ckpt", str(tmp_path / "model"), "--task", "complete", "--rows", "2", "--samples", "1",
                 "--images", str(picture), "--out", str(tmp_path / "out"), "--device", "cpu"])
    err = capsys.readouterr().err
    named = [line for line in err.splitlines() if "fake line" in line]
    assert len(named) >= 3 and all(SHOWN in line or SHOWN.removesuffix(".png") in line for line in named), named
    assert "\x1b" not in err and not any(line.startswith("error: fake") for line in err.splitlines())


def test_a_preset_read_outside_the_command_bounds_its_aliases(tmp_path):
    """read_preset (benchmarks, the speed check, resume settings) used plain yaml.safe_load: a few hundred
    bytes of aliases expanded to gigabytes. It bounds them as the commands do (cli/config_guard.py)."""
    from imagetx.training.bounded_yaml import ExpansionRefused
    from imagetx.training.presets import read_preset

    laughs = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        laughs.append(f"{chr(97 + level)}: &{chr(97 + level)} [{', '.join([f'*{chr(96 + level)}'] * 10)}]")
    (tmp_path / "bomb.yaml").write_text("\n".join(laughs) + "\n")
    with pytest.raises(ExpansionRefused):
        read_preset(tmp_path / "bomb.yaml")
    assert read_preset("configs/quick.yaml")["model"]["config"]["n_layers"] == 2
