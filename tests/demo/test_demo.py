"""The demo page's handlers (imagetx.demo.tasks), called as the page calls them, without a
browser: completions keep the given rows, every kind of picture is read or refused with its
reason (never an exception), the val bits/dim comes from the model card, and the command's
argument errors are one line. tests/demo/test_demo_browser.py drives the real page."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import BAD_PICTURES, COMPLETION_CARD_BPD, PICTURE_KINDS, one_error_line, tiny_model, write_pictures
from imagetx.data.images import MAX_FILE_BYTES, load_image_file, upsample_nearest
from imagetx.demo import tasks
from imagetx.demo.__main__ import NEEDS_GRADIO, main
from imagetx.demo.tasks import SCALE, SUPERRES_TEMPERATURES, Models, card_bits_per_dim
from imagetx.io.load import load_model
from imagetx.model.superres import downsample_area

REPO = Path(__file__).resolve().parents[2]
REFUSED = "**Cannot do that**"


def pixels(image: Image.Image) -> np.ndarray:
    """A shown (enlarged) image -> the model's pixels: one of each SCALE x SCALE square."""
    return np.asarray(image.convert("RGB"))[::SCALE, ::SCALE]


@pytest.fixture(scope="module")
def shipped() -> Models:
    completion, superres = REPO / "pretrained" / "completion", REPO / "pretrained" / "superres"
    return Models(load_model(completion), load_model(superres), "pretrained/completion", "pretrained/superres",
                  card_bits_per_dim(completion), card_bits_per_dim(superres))


@pytest.fixture
def tiny() -> Models:
    """Tiny models: a 32x32 DMOL completion one (so a photo is prepared as for the shipped one) and a
    4x4 super-resolution one from a 2x2 input."""
    return Models(tiny_model(image_size=32, head="dmol"), tiny_model(seed=1, encoder_layers=1, low_res_size=2),
                  "tiny", "tiny-sr")


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> dict:
    return write_pictures(tmp_path_factory.mktemp("pictures"))


def test_a_photo_keeps_its_rows_and_the_samples_grow(shipped, pictures):
    path, note = pictures["photo.jpg"]
    prepared = load_image_file(path, 32)[0].numpy()
    rows = 30  # two rows left to draw: a couple of seconds on a CPU
    outputs = list(shipped.complete(str(path), rows, 2, 1.0, 0))
    assert len(outputs) >= 2  # at least once as it grows, then finished
    original, kept, samples, files, status = outputs[-1]
    assert note in status and f"val bits/dim {COMPLETION_CARD_BPD}" in status and "of sampling" in status, status
    np.testing.assert_array_equal(pixels(original), prepared)
    np.testing.assert_array_equal(pixels(kept)[:rows], prepared[:rows])
    assert (pixels(kept)[rows:] == 128).all()  # the part not given: grey
    assert [caption for _, caption in samples] == ["sample 1", "sample 2"]
    assert len(files) == 2
    for (image, _), file in zip(samples, files):
        assert image.size == (32 * SCALE, 32 * SCALE)
        np.testing.assert_array_equal(pixels(image)[:rows], prepared[:rows])
        np.testing.assert_array_equal(np.asarray(Image.open(file)), np.asarray(image))  # the download is the shown one
    first = outputs[0]  # right after the given rows: those, and nothing drawn yet
    assert first[3] is None and first[4].startswith("sampling:"), first[4]
    np.testing.assert_array_equal(pixels(first[2][0][0])[:rows], prepared[:rows])
    assert (pixels(first[2][0][0])[rows:] == 0).all()


@pytest.mark.parametrize("name", sorted(PICTURE_KINDS))
def test_every_kind_of_picture_is_read_or_refused_with_its_reason(tiny, pictures, name):
    path, said = pictures[name]
    completed = list(tiny.complete(str(path), 31, 1, 1.0, 0))  # one row to draw
    upsampled = list(tiny.upsample(str(path), 0)) if name in BAD_PICTURES else []  # (good ones: below)
    for outputs in filter(None, (completed, upsampled)):
        status = outputs[-1][-1]
        assert said in status, status
        if name in BAD_PICTURES:
            assert outputs == [outputs[-1]] and status.startswith(REFUSED)  # refused at once, nothing shown
            assert all(output in (None, []) for output in outputs[-1][:-1])
        else:
            assert not status.startswith(REFUSED) and len(outputs[-1][-2]) >= 1  # samples to download


def test_a_file_over_the_size_limit_is_refused_before_decoding(tiny, tmp_path):
    huge = tmp_path / "huge.png"
    with huge.open("wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)  # sparse: no need to write 20 MB
    [outputs] = list(tiny.complete(str(huge), 2, 1, 1.0, 0))
    assert outputs[-1].startswith(REFUSED) and "files over 20.0 MB are refused" in outputs[-1], outputs[-1]


def test_no_upload_and_bad_requests_say_what_to_do(tiny, pictures):
    for handler in (lambda: tiny.complete(None, 2, 1, 1.0, 0), lambda: tiny.upsample("", 0)):
        [outputs] = list(handler())
        assert outputs[-1] == f"{REFUSED}: no picture: upload one or pick an example"
    photo = str(pictures["photo.jpg"][0])
    [outputs] = list(tiny.complete(photo, 33, 1, 1.0, 0))  # more rows than the picture has
    assert outputs[-1].startswith(REFUSED) and "given_rows=33 is invalid" in outputs[-1], outputs[-1]
    [outputs] = list(tiny.generate(1, -1.0, 0))
    assert outputs[-1].startswith(REFUSED) and "temperature -1.0 is invalid" in outputs[-1], outputs[-1]


@pytest.mark.parametrize("seed", [2**64 + 5, 2**64, -1, 0.5, float("nan"), float("inf")])
def test_a_seed_torch_cannot_take_is_refused_in_every_task(tiny, pictures, seed):
    # issue 124: 2**64 + 5 raised torch's "Overflow when unpacking long long" out of the page
    photo = str(pictures["photo.jpg"][0])
    for handler in (lambda: tiny.complete(photo, 31, 1, 1.0, seed), lambda: tiny.upsample(photo, seed),
                    lambda: tiny.generate(1, 1.0, seed)):
        [outputs] = list(handler())
        assert outputs[-1].startswith(REFUSED) and f"seed {seed} cannot" in outputs[-1], outputs[-1]
        assert "from 0 to 18446744073709551615" in outputs[-1], outputs[-1]


def test_the_largest_seed_and_an_emptied_seed_box_sample(tiny):
    for seed in (2**64 - 1, float(2**63), None):
        status = list(tiny.generate(1, 1.0, seed))[-1][-1]
        assert not status.startswith(REFUSED) and "1 sample(s)" in status, status


def test_a_bug_inside_a_task_is_raised_not_shown_as_a_refusal(tiny, monkeypatch):
    # A plain ValueError is a bug in imagetx (imagetx/errors.py): Gradio shows an error and logs
    # its traceback, rather than the page answering as if the request were at fault.
    def broken(*args, **kwargs):
        raise ValueError("an invariant of imagetx broke")

    monkeypatch.setattr(tasks, "sample_progressively", broken)
    with pytest.raises(ValueError, match="an invariant of imagetx broke"):
        list(tiny.generate(1, 1.0, 0))


def test_superres_shows_the_low_resolution_input_and_one_sample_per_temperature(tiny, pictures, tmp_path):
    path = pictures["photo.jpg"][0]
    small, samples, original, files, status = list(tiny.upsample(str(path), 0))[-1]
    prepared, note = load_image_file(path, 4)
    low_res = downsample_area(prepared[None], 2)
    np.testing.assert_array_equal(pixels(small), upsample_nearest(low_res, 4)[0].numpy())
    np.testing.assert_array_equal(pixels(original), prepared.numpy())
    assert [caption for _, caption in samples] == [f"temperature {t}" for t in SUPERRES_TEMPERATURES]
    assert len(files) == 3 and note in status and "val bits/dim not measured" in status, status
    tiny_picture = tmp_path / "two.png"  # smaller than the model's images: its enlargement is no original
    Image.fromarray(np.zeros((2, 2, 3), np.uint8)).save(tiny_picture)
    assert list(tiny.upsample(str(tiny_picture), 0))[-1][2] is None


def test_generate_draws_the_chosen_class():
    models = Models(tiny_model(num_classes=3), tiny_model(encoder_layers=1, low_res_size=2), "tiny", "tiny-sr")
    samples, files, status = list(models.generate(2, 1.0, 5, label=2))[-1]
    assert len(samples) == len(files) == 2 and "of class 2" in status, status
    assert tasks.labels_for(models.completion, 2, tasks.chosen_class(2)).tolist() == [2, 2]
    assert tasks.labels_for(models.completion, 2, tasks.chosen_class(None)).tolist() == [0, 0]  # emptied dropdown
    assert tasks.labels_for(tiny_model(), 2, 2) is None  # an unconditional model is given no labels


def test_the_page_is_built_with_a_class_dropdown_only_for_a_class_conditional_model(tiny):
    from imagetx.demo.page import build, class_choice

    assert build(tiny) is not None
    assert not class_choice(tiny.completion).visible
    assert class_choice(tiny_model(num_classes=3)).visible


def test_bits_per_dim_comes_from_the_model_card(tmp_path):
    assert card_bits_per_dim(REPO / "pretrained" / "completion") == COMPLETION_CARD_BPD
    assert card_bits_per_dim(REPO / "pretrained" / "superres") == "3.165"
    card = (REPO / "pretrained" / "completion" / "README.md").read_text()
    cases = {"no_card": None, "no_front_matter": "# a model\n", "bad_yaml": "---\nmodel-index: [\n---\n",
             "no_figure": card.replace("bits_per_dim\n      name", "accuracy\n      name")}
    for name, text in cases.items():
        (tmp_path / name).mkdir()
        if text is not None:
            (tmp_path / name / "README.md").write_text(text)
        assert card_bits_per_dim(tmp_path / name) == "not measured", name
    (tmp_path / "model.ckpt").write_bytes(b"")  # a checkpoint file has no card
    assert card_bits_per_dim(tmp_path / "model.ckpt") == "not measured"


def test_the_bundled_examples_are_small_32x32_pictures():
    examples = tasks.examples()
    assert len(examples) >= 3
    for path in examples:
        with Image.open(path) as image:
            assert image.size == (32, 32) and image.mode == "RGB"
        assert Path(path).stat().st_size < 5_000  # bytes: tiny files in the package


def test_without_gradio_the_command_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gradio", None)  # what `import gradio` does when it is not installed
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2  # bad input, as every command says it
    assert capsys.readouterr().err == f"error: {NEEDS_GRADIO}\n"
    assert NEEDS_GRADIO == "the demo needs gradio: pip install 'imagetx[demo]'"


def test_argument_errors_are_one_line(capsys, tmp_path):
    line = one_error_line(capsys, main, ["--ckpt", str(tmp_path / "nowhere")])
    assert "--ckpt" in line and "does not exist" in line and "give a weights folder" in line, line
    line = one_error_line(capsys, main, ["--ckpt", str(REPO / "pretrained" / "superres")])
    assert "is a super-resolution model: give it as --superres-ckpt" in line, line
    line = one_error_line(capsys, main, ["--port", "70000"])
    assert "--port 70000 is outside 1..65535" in line, line


def test_the_time_said_includes_preparing_the_picture(tiny, pictures, monkeypatch):
    """A large photo's preparation is part of what the user waited for: the status counts it
    (here made to take 0.3 s) in the total, beside the seconds of sampling."""
    prepare = tasks.load_image_file

    def slow_prepare(*args, **kwargs):
        time.sleep(0.3)
        return prepare(*args, **kwargs)

    monkeypatch.setattr(tasks, "load_image_file", slow_prepare)
    path = str(pictures["photo.jpg"][0])
    for status in (list(tiny.complete(path, 31, 1, 1.0, 0))[-1][-1], list(tiny.upsample(path, 0))[-1][-1]):
        total, preparing, sampling = map(float, re.search(
            r"in (\d+\.\d) s \((\d+\.\d) s preparing the picture, (\d+\.\d) s of sampling\)", status).groups())
        # Each figure is rounded to 0.1 s (±0.05), so three of them may disagree by 0.15 with nothing
        # missing; a total without the 0.3 s of preparing would be 0.3 short.
        assert preparing >= 0.3 and abs(total - preparing - sampling) <= 0.15 + 1e-9, status


def test_the_page_opens_on_the_readmes_headline_models_where_they_are_shipped(monkeypatch, tmp_path):
    """The GPU-trained models, which the README leads with, when the shipped folder has them; the
    small CPU-trained ones where it does not."""
    from imagetx.demo import __main__ as demo

    defaults = demo.build_parser().get_defaults()
    assert Path(defaults.ckpt) == REPO / "pretrained" / "cifar10_gpu"
    assert Path(defaults.superres_ckpt) == REPO / "pretrained" / "superres_gpu"
    (tmp_path / "completion").mkdir()
    monkeypatch.setattr(demo, "PRETRAINED", tmp_path)
    assert demo.first_shipped("cifar10_gpu", "completion") == str(tmp_path / "completion")


def test_the_page_names_the_models_it_serves_and_their_figures(tiny):
    """Issue 126: it said "Small models trained on a 2-core CPU ... do not draw objects" while it
    served the GPU-trained models."""
    from imagetx.demo.page import intro

    served = Models(tiny.completion, tiny.superres, "pretrained/cifar10_gpu", "pretrained/superres_gpu", "3.066", "2.988")
    said = intro(served)
    assert "`pretrained/cifar10_gpu` (val bits/dim 3.066)" in said
    assert "`pretrained/superres_gpu` (2.988 given the 8×8 input)" in said
    assert "2-core CPU" not in said
