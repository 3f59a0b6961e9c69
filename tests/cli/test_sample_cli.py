"""imagetx.sample (the sampling CLI): grids, JSON summaries, user images, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import ExifTags, Image

from helpers import BAD_PICTURES, PICTURE_KINDS, tiny_model, write_cifar_npz, write_pictures
from imagetx import save_pretrained
from imagetx.sample import main
from imagetx.data.sources import load

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

PAD, SIDE, SCALE = 2, 32, 4  # make_grid padding, image side, the grids' default nearest-neighbour scale


def grid_size(rows, cols):
    """(width, height) of a saved grid of rows x cols 32-pixel images."""
    return ((cols * (SIDE + PAD) + PAD) * SCALE, (rows * (SIDE + PAD) + PAD) * SCALE)


def cell(grid: np.ndarray, row: int, col: int) -> np.ndarray:
    """The 32x32x3 image at (row, col) of a saved grid, undoing the nearest-neighbour enlargement."""
    small = grid[::SCALE, ::SCALE]
    top, left = PAD + row * (SIDE + PAD), PAD + col * (SIDE + PAD)
    return small[top : top + SIDE, left : left + SIDE]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    # 32x32 DMOL, one layer of d=16: 1024 cheap sampling steps.
    model = tiny_model(seed=21, image_size=32, head="dmol", query_block_length=64)
    path = tmp_path_factory.mktemp("ckpt") / "model"
    save_pretrained(model, path)
    return path


@pytest.fixture
def data_root(tmp_path):
    root = tmp_path / "data"
    train_images, _, _, _ = write_cifar_npz(root, train_sizes=(6,))
    return root, train_images


def run_ok(capsys, args):
    main(args)
    captured = capsys.readouterr()
    return json.loads(captured.out.strip().splitlines()[-1]), captured.err


def run_error(capsys, args) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err, err  # one line, no traceback
    assert "Traceback" not in captured.out + captured.err
    return err


def test_generate_writes_grid_and_summary(tmp_path, capsys, ckpt):
    out = tmp_path / "out"
    summary, _ = run_ok(capsys, ["--ckpt", str(ckpt), "--task", "generate", "--count", "2", "--out", str(out),
                                 "--device", "cpu", "--seed", "3"])
    with Image.open(out / "generate.png") as image:
        image.verify()
    with Image.open(out / "generate.png") as image:
        assert image.format == "PNG" and image.mode == "RGB"
        assert image.size == grid_size(1, 2)
        grid = np.asarray(image)
    saved = json.loads((out / "generate.json").read_text())
    assert saved["images"] == 2 == summary["images"]
    assert saved["files"] == [str(out / "generate.png")] and saved["seed"] == 3
    # the grid holds the images the sampler draws with this seed
    from imagetx import load_model
    from imagetx.model.sampler import sample

    expected = sample(load_model(ckpt), 2, generator=torch.Generator().manual_seed(3))
    for i in range(2):
        np.testing.assert_array_equal(cell(grid, 0, i), expected[i].numpy())


def test_complete_from_npz_split(tmp_path, capsys, ckpt, data_root):
    root, train_images = data_root
    out = tmp_path / "out"
    summary, _ = run_ok(capsys, ["--ckpt", str(ckpt), "--task", "complete", "--count", "2", "--samples", "1",
                                 "--rows", "16", "--data.root", str(root), "--split", "val", "--val_size", "3",
                                 "--out", str(out), "--device", "cpu"])
    assert summary["images"] == 2 and (out / "complete.json").is_file()
    with Image.open(out / "complete.png") as image:
        assert image.size == grid_size(2, 3)  # per input: given prefix | 1 sample | original
        grid = np.asarray(image.convert("RGB"))
    originals = train_images[3:5]  # val = the last 3 training images; the first 2 of them
    for i in range(2):
        shown, completed, original = cell(grid, i, 0), cell(grid, i, 1), cell(grid, i, 2)
        np.testing.assert_array_equal(original, originals[i])
        np.testing.assert_array_equal(shown[:16], originals[i][:16])
        assert (shown[16:] == 128).all()  # the part the model is not shown is grey
        np.testing.assert_array_equal(completed[:16], originals[i][:16])  # the prefix is kept
        assert not np.array_equal(completed[16:], originals[i][16:])


def test_complete_user_image_is_cropped_and_resized(tmp_path, capsys, ckpt):
    rng = np.random.default_rng(0)
    picture = tmp_path / "mine.png"
    Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(picture)  # 50 wide, 40 high
    out = tmp_path / "out"
    summary, err = run_ok(capsys, ["--ckpt", str(ckpt), "--task", "complete", "--samples", "1", "--rows", "16",
                                   "--images", str(picture), "--out", str(out), "--device", "cpu"])
    assert "mine.png: 50x40, centre-cropped to 40x40, resized to 32x32" in err
    assert summary["images"] == 1
    with Image.open(out / "complete.png") as image:
        assert image.size == grid_size(1, 3)


def test_a_photo_is_prepared_as_the_folder_conversion_prepares_a_training_image(tmp_path, capsys, ckpt):
    photo = tmp_path / "photos" / "photo.jpg"
    photo.parent.mkdir()
    rng = np.random.default_rng(1)
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6  # stored on its side: turned a quarter when read
    Image.fromarray(rng.integers(0, 256, (45, 70, 3), dtype=np.uint8)).save(photo, exif=exif, quality=95)
    converted = load("folder", photo.parent, "train", val_size=0, image_size=SIDE)[0][0]
    out = tmp_path / "out"
    _, err = run_ok(capsys, ["--ckpt", str(ckpt), "--task", "complete", "--samples", "1", "--rows", "16",
                             "--images", str(photo), "--out", str(out), "--device", "cpu"])
    assert "photo.jpg: turned upright (EXIF orientation 6) to 45x70, centre-cropped to 45x45, resized to 32x32" in err
    with Image.open(out / "complete.png") as image:
        original = cell(np.asarray(image.convert("RGB")), 0, 2)
    np.testing.assert_array_equal(original, converted.numpy())


@pytest.mark.parametrize("rows", [SIDE + 8, SIDE, -1])  # SIDE: every row given, nothing left to complete
def test_error_rows_out_of_range(tmp_path, capsys, ckpt, data_root, rows):
    err = run_error(capsys, ["--ckpt", str(ckpt), "--task", "complete", "--rows", str(rows),
                             "--data.root", str(data_root[0]), "--out", str(tmp_path / "o")])
    assert f"--rows {rows}" in err and f"0..{SIDE - 1}" in err  # the range evaluate takes too
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,needle", [
    (["--count", "0"], "--count 0"),
    (["--temperature", "-1"], "temperature"),
    (["--label", "3"], "unconditional"),
])
def test_error_bad_requests(tmp_path, capsys, ckpt, args, needle):
    err = run_error(capsys, ["--ckpt", str(ckpt), "--task", "generate", "--out", str(tmp_path / "o"), *args])
    assert needle in err
    assert not (tmp_path / "o" / "generate.png").exists()


def test_error_file_that_is_not_an_image(tmp_path, capsys, ckpt):
    fake = tmp_path / "x.png"
    fake.write_text("this is text, not a PNG\n")
    err = run_error(capsys, ["--ckpt", str(ckpt), "--task", "complete", "--images", str(fake),
                             "--out", str(tmp_path / "o")])
    assert "x.png" in err and "not an image" in err


def test_error_missing_image_file(tmp_path, capsys, ckpt):
    err = run_error(capsys, ["--ckpt", str(ckpt), "--task", "complete", "--images", str(tmp_path / "gone.png"),
                             "--out", str(tmp_path / "o")])
    assert "gone.png" in err


def test_error_output_directory_not_writable(tmp_path, capsys, ckpt):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    err = run_error(capsys, ["--ckpt", str(ckpt), "--task", "generate", "--count", "1",
                             "--out", str(blocker / "out")])
    assert "cannot write" in err and str(blocker / "out") in err


def test_error_missing_checkpoint(tmp_path, capsys):
    err = run_error(capsys, ["--ckpt", str(tmp_path / "none.ckpt"), "--out", str(tmp_path / "o")])
    assert "none.ckpt" in err


# ----- every sample in one batch; grids people can see; pictures of every kind -----------------

@pytest.fixture(scope="module")
def superres_ckpt(tmp_path_factory):
    model = tiny_model(seed=22, image_size=32, head="dmol", query_block_length=64, encoder_layers=1, low_res_size=8,
                       low_res_reading="cell_add")
    path = tmp_path_factory.mktemp("ckpt") / "superres"
    save_pretrained(model, path)
    return path


@pytest.fixture
def counted_decoding(monkeypatch):
    """Every prefill's and decode_step's batch size, as the command calls them, of either kind of model
    (both methods are written once, in the base both kinds share)."""
    from imagetx.model.transformer import AutoregressiveModel

    calls = {"prefill": [], "decode_step": []}

    def counted(method, name, batch):
        def call(self, values, cache):
            calls[name].append(batch(values))
            return method(self, values, cache)
        return call

    batch = {"prefill": lambda given: tuple(given.shape[:2]), "decode_step": lambda previous: previous.shape[0]}
    for name in batch:
        monkeypatch.setattr(AutoregressiveModel, name, counted(getattr(AutoregressiveModel, name), name, batch[name]))
    return calls


def test_complete_draws_every_sample_of_every_input_in_one_batch(tmp_path, capsys, ckpt, data_root,
                                                                counted_decoding):
    root, train_images = data_root
    out = tmp_path / "out"
    summary, _ = run_ok(capsys, ["--ckpt", str(ckpt), "--task", "complete", "--count", "2", "--samples", "3",
                                 "--rows", "16", "--data.root", str(root), "--split", "val", "--val_size", "3",
                                 "--out", str(out), "--device", "cpu", "--seed", "4"])
    # the given half (512 of 1024 pixels) in one pass, then the other half step by step, 6 images at once
    assert counted_decoding == {"prefill": [(6, 512)], "decode_step": [6] * 512}
    assert summary["images"] == 6 and 0 < summary["sampling_seconds"] <= summary["seconds"]
    with Image.open(out / "complete.png") as image:
        grid = np.asarray(image.convert("RGB"))
    from imagetx import load_model
    from imagetx.model.sampler import sample

    prefix = torch.from_numpy(train_images[3:5]).repeat_interleave(3, dim=0)  # sample j of input i: row i, column j
    expected = sample(load_model(ckpt), 6, prefix=prefix, given_rows=16, generator=torch.Generator().manual_seed(4))
    for i in range(2):
        for j in range(3):
            np.testing.assert_array_equal(cell(grid, i, 1 + j), expected[3 * i + j].numpy())


def test_superres_draws_every_temperature_in_one_batch(tmp_path, capsys, superres_ckpt, data_root,
                                                       counted_decoding):
    root, train_images = data_root
    out = tmp_path / "out"
    summary, _ = run_ok(capsys, ["--ckpt", str(superres_ckpt), "--task", "superres", "--count", "2",
                                 "--temperatures", "0", "0.9", "1.0", "--data.root", str(root), "--val_size", "3",
                                 "--out", str(out), "--device", "cpu"])
    assert counted_decoding == {"prefill": [], "decode_step": [6] * 1024}
    assert summary["images"] == 6
    with Image.open(out / "superres.png") as image:
        grid = np.asarray(image.convert("RGB"))
        assert image.size == grid_size(2, 5)  # upsampled input | 3 temperatures | original
    from imagetx import load_model
    from imagetx.model.superres import downsample_area
    from imagetx.model.sampler import sample

    originals = torch.from_numpy(train_images[3:5])
    greedy = sample(load_model(superres_ckpt), 2, low_res=downsample_area(originals, 8), temperature=0.0)
    for i in range(2):  # temperature 0 draws nothing at random: its column is the argmax image, whatever the batch
        np.testing.assert_array_equal(cell(grid, i, 1), greedy[i].numpy())
        np.testing.assert_array_equal(cell(grid, i, 4), originals[i].numpy())


def test_scale_one_writes_the_raw_pixels(tmp_path, capsys, ckpt):
    out = tmp_path / "out"
    run_ok(capsys, ["--ckpt", str(ckpt), "--task", "generate", "--count", "2", "--scale", "1", "--out", str(out),
                    "--device", "cpu"])
    with Image.open(out / "generate.png") as image:
        assert image.size == (2 * (SIDE + PAD) + PAD, SIDE + 2 * PAD)
    err = run_error(capsys, ["--ckpt", str(ckpt), "--task", "generate", "--scale", "0", "--out", str(out)])
    assert "--scale 0" in err


@pytest.mark.parametrize("name", [name for name in PICTURE_KINDS if name not in BAD_PICTURES])
def test_a_picture_of_any_kind_is_made_rgb_and_the_command_says_how(tmp_path, capsys, ckpt, name):
    path, said = write_pictures(tmp_path / "pictures")[name]
    out = tmp_path / "out"
    _, err = run_ok(capsys, ["--ckpt", str(ckpt), "--task", "complete", "--samples", "1", "--images", str(path),
                             "--out", str(out), "--device", "cpu"])
    assert said in err
    assert (out / "complete.png").is_file()


@pytest.mark.parametrize("name", BAD_PICTURES)
def test_a_bad_picture_is_refused_in_one_line(tmp_path, capsys, ckpt, name):
    path, said = write_pictures(tmp_path / "pictures")[name]
    err = run_error(capsys, ["--ckpt", str(ckpt), "--task", "complete", "--images", str(path),
                             "--out", str(tmp_path / "o")])
    assert name in err and said in err


def test_an_earlier_grid_is_refused_without_force_and_replaced_with_it(tmp_path, capsys, ckpt):
    out = tmp_path / "out"
    args = ["--ckpt", str(ckpt), "--task", "generate", "--count", "1", "--out", str(out), "--device", "cpu"]
    run_ok(capsys, [*args, "--seed", "1"])
    earlier = (out / "generate.png").read_bytes(), (out / "generate.json").read_text()
    err = run_error(capsys, [*args, "--seed", "2"])
    assert str(out / "generate.png") in err and "--force" in err
    assert ((out / "generate.png").read_bytes(), (out / "generate.json").read_text()) == earlier  # nothing written
    summary, _ = run_ok(capsys, [*args, "--seed", "2", "--force"])
    assert summary["seed"] == 2 and json.loads((out / "generate.json").read_text())["seed"] == 2


# ----- classes by name -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def conditional_ckpt(tmp_path_factory):
    model = tiny_model(seed=22, image_size=32, head="dmol", query_block_length=64, num_classes=10)
    path = tmp_path_factory.mktemp("conditional") / "model"
    save_pretrained(model, path)
    return path


def test_a_label_is_a_number_or_a_class_name_and_the_classes_drawn_are_said(tmp_path, capsys, conditional_ckpt):
    args = ["--ckpt", str(conditional_ckpt), "--task", "generate", "--count", "2", "--device", "cpu"]
    by_name, err = run_ok(capsys, [*args, "--label", "cat", "--out", str(tmp_path / "name")])
    assert by_name["labels"] == [3, 3] and by_name["classes"][3] == "cat"  # CIFAR-10's label 3
    assert "classes: 3 cat (--label)" in err
    by_number, _ = run_ok(capsys, [*args, "--label", "3", "--out", str(tmp_path / "number")])
    assert by_number["labels"] == [3, 3]
    assert (tmp_path / "name" / "generate.png").read_bytes() == (tmp_path / "number" / "generate.png").read_bytes()
    in_turn, err = run_ok(capsys, [*args, "--out", str(tmp_path / "turn")])
    assert in_turn["labels"] == [0, 1] and "every class in turn (0 airplane, 1 automobile)" in err, err


def test_a_name_that_is_no_class_is_refused_naming_the_closest(tmp_path, capsys, conditional_ckpt):
    err = run_error(capsys, ["--ckpt", str(conditional_ckpt), "--task", "generate", "--label", "cta",
                             "--out", str(tmp_path / "o")])
    assert "'cta' is not a class" in err and "did you mean 'cat'" in err and "0..9" in err
    assert not (tmp_path / "o").exists()


def test_a_folders_classes_are_its_sub_folders_in_the_conversions_order(tmp_path):
    from imagetx.cli.classes import class_names, class_number

    for name in ("dogs", "cats", "birds"):
        (tmp_path / name).mkdir()
        Image.new("RGB", (SIDE, SIDE)).save(tmp_path / name / "a.png")
    names = class_names("folder", str(tmp_path), 3)
    assert names == ["birds", "cats", "dogs"]
    assert class_number("dogs", names, 3) == 2
    assert class_names("folder", str(tmp_path), 10) is None  # another model's classes: no names
    assert class_names("imagenet", str(tmp_path), 3) is None


def test_an_empty_picture_is_refused_as_empty(tmp_path, capsys, ckpt):
    """A 0-byte --images file: "empty", not "not an image PIL can read" (issue 111 §3 item 10)."""
    empty = tmp_path / "photo.png"
    empty.write_bytes(b"")
    err = run_error(capsys, ["--ckpt", str(ckpt), "--task", "complete", "--images", str(empty),
                             "--out", str(tmp_path / "o")])
    assert "photo.png is empty (0 bytes)" in err
