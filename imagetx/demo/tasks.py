"""What the demo page runs, without Gradio: the three tasks as generators that yield what the
page shows as sampling goes on (so the samples grow row by row), and never raise for a bad
upload or request: the last thing yielded then says what is wrong, and the page keeps serving.

Each task yields tuples in the order of the page's outputs (``page.py``); images are PIL images
enlarged ``SCALE`` times with nearest neighbours (each model pixel a square, not smoothed).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from huggingface_hub import ModelCard
from PIL import Image

from ..data.images import enlarged, load_image_file, upsample_nearest
from ..errors import UserError
from ..model.sampler import Progress, sample_progressively
from ..model.superres import downsample_area
from ..model.transformer import AutoregressiveModel
from ..sample import given_part, labels_for

# 8x: a 32-pixel image becomes 256 pixels, each model pixel an 8x8 square that can be told
# apart by eye, and four samples in a row still fit a laptop screen.
SCALE = 8
# as imagetx.sample's --task superres: below 1 sharper and plainer, 1 the model's own distribution
SUPERRES_TEMPERATURES = (0.8, 0.9, 1.0)
# four CIFAR-10 val images (training images 45,000+, never trained on), named by their index
EXAMPLES = Path(__file__).with_name("examples")
NOT_MEASURED = "not measured"
SEEDS = range(2**64)  # what torch.Generator.manual_seed takes: an unsigned 64-bit number


def card_bits_per_dim(path: str | Path) -> str:
    """The val bits/dim in a weights folder's model card (README.md's Hub front matter, read by
    huggingface_hub's ``ModelCard`` as the Hub reads it: an eval result of type bits_per_dim), as
    text; "not measured" for a checkpoint file, a folder without a card, a card without the
    figure, or one whose front matter cannot be read."""
    card = Path(path) / "README.md"
    if not card.is_file():  # a checkpoint file, or no card (and never a Hub id to download)
        return NOT_MEASURED
    try:
        results = ModelCard.load(card).data.eval_results or []
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, yaml.YAMLError):  # unreadable front matter
        return NOT_MEASURED
    figures = [str(result.metric_value) for result in results if result.metric_type == "bits_per_dim"]
    return figures[0] if figures else NOT_MEASURED


def examples() -> list[str]:
    """The bundled example pictures (small CIFAR-10 val images), for the page's example lists."""
    return sorted(str(path) for path in EXAMPLES.glob("*.png"))


def shown(image: torch.Tensor) -> Image.Image:
    """(H, W, 3) uint8 -> the PIL image the page shows: ``SCALE`` times larger."""
    return enlarged(Image.fromarray(image.cpu().numpy()), SCALE)


def chosen_class(label: int | None) -> int:
    """The class picked in the page's dropdown (``labels_for`` gives it to every image); an
    emptied dropdown picks class 0."""
    return int(label or 0)


def seconds(value: float) -> str:
    return f"{value:.1f} s"


@dataclass
class Models:
    """The two models the page serves, with where they came from and their val bits/dim."""

    completion: AutoregressiveModel
    superres: AutoregressiveModel
    completion_path: str
    superres_path: str
    completion_bpd: str = NOT_MEASURED
    superres_bpd: str = NOT_MEASURED
    # samples offered for download are written here, one folder per request (Gradio copies them
    # into its own cache); removed when the process ends
    downloads: tempfile.TemporaryDirectory = field(
        default_factory=lambda: tempfile.TemporaryDirectory(prefix="imagetx-demo-"))

    # ----- the tasks: generators of the page's outputs -----------------------------------

    def complete(self, upload: str | None, rows: int, count: int, temperature: float, seed: int | None,
                 label: int | None = None) -> Iterator[tuple]:
        """Outputs (original, kept part, samples [(image, caption)], PNG files, status)."""
        model = self.completion
        empty = (None, None, [], None)
        try:
            picture, note, preparing = self.picture(upload, model)
            rows, count = int(rows), int(count)
            prefix = picture[None].repeat(count, 1, 1, 1)
            states = sample_progressively(model, count, labels_for(model, count, chosen_class(label)),
                                          temperature=temperature, prefix=prefix, given_rows=rows,
                                          generator=seeded(seed), every=steps_per_row(model))
            original, kept = shown(picture), shown(given_part(picture[None], rows)[0])
            for state, elapsed in timed(states):
                samples = [(shown(image), f"sample {i + 1}") for i, image in enumerate(state.images)]
                if not state.done:
                    yield original, kept, samples, None, growing(state, elapsed)
            files = self.saved(samples, Path(upload).stem, "completion")
            yield (original, kept, samples, files,
                   f"**{count} sample(s)** from the top {rows} rows in {took(preparing, elapsed)}. "
                   f"{note}. {self.card('completion')}")
        except (UserError, OSError, FloatingPointError) as error:  # PictureError among them; another: a bug, raised
            yield *empty, refused(error)

    def upsample(self, upload: str | None, seed: int | None, label: int | None = None) -> Iterator[tuple]:
        """Outputs (the 8x8 input, samples [(image, temperature)], original or None, PNG files, status)."""
        model, temperatures = self.superres, list(SUPERRES_TEMPERATURES)
        empty = (None, [], None, None)
        try:
            picture, note, preparing = self.picture(upload, model)
            low_res = downsample_area(picture[None], model.config.superres.low_res_size)
            count = len(temperatures)
            states = sample_progressively(model, count, labels_for(model, count, chosen_class(label)),
                                          low_res=low_res.repeat(count, 1, 1, 1), temperature=temperatures,
                                          generator=seeded(seed), every=steps_per_row(model))
            small = shown(upsample_nearest(low_res, model.config.image_size)[0])
            # the prepared picture is the truth the 8x8 averages only if it was not enlarged from a smaller one
            with Image.open(upload) as opened:
                original = shown(picture) if min(opened.size) >= model.config.image_size else None
            for state, elapsed in timed(states):
                samples = [(shown(image), f"temperature {t}") for image, t in zip(state.images, temperatures)]
                if not state.done:
                    yield small, samples, original, None, growing(state, elapsed)
            files = self.saved(samples, Path(upload).stem, "superres")
            yield (small, samples, original, files,
                   f"**{count} samples** at temperatures {', '.join(map(str, temperatures))} from the "
                   f"{low_res.shape[1]}x{low_res.shape[2]} average in {took(preparing, elapsed)}. "
                   f"{note}. {self.card('superres')}")
        except (UserError, OSError, FloatingPointError) as error:
            yield *empty, refused(error)

    def generate(self, count: int, temperature: float, seed: int | None, label: int | None = None) -> Iterator[tuple]:
        """Outputs (samples [(image, caption)], PNG files, status)."""
        model = self.completion
        try:
            count = int(count)
            states = sample_progressively(model, count, labels_for(model, count, chosen_class(label)),
                                          temperature=temperature, generator=seeded(seed), every=steps_per_row(model))
            for state, elapsed in timed(states):
                samples = [(shown(image), f"sample {i + 1}") for i, image in enumerate(state.images)]
                if not state.done:
                    yield samples, None, growing(state, elapsed)
            of_class = f" of class {chosen_class(label)}" if model.config.num_classes else ""
            yield (samples, self.saved(samples, "generated", "sample"),
                   f"**{count} sample(s)**{of_class} in {seconds(elapsed)} of sampling. {self.card('completion')}")
        except (UserError, FloatingPointError) as error:
            yield [], None, refused(error)

    # ----- helpers ------------------------------------------------------------------------

    def picture(self, upload: str | None, model: AutoregressiveModel) -> tuple[torch.Tensor, str, float]:
        """The upload prepared as the model's training images were (centre crop, area resize), the
        note of what was done and the seconds it took (the user waited for them too); a ValueError
        saying what to do when there is none."""
        if not upload:
            raise UserError("no picture: upload one or pick an example")
        started = time.perf_counter()
        picture, note = load_image_file(upload, model.config.image_size, crop="center", resize="area",
                                        name=Path(upload).name)
        return picture, note, time.perf_counter() - started

    def card(self, which: str) -> str:
        """Which model answered, and its val bits/dim: ``which`` is "completion" or "superres"."""
        path, bpd = {"completion": (self.completion_path, self.completion_bpd),
                     "superres": (self.superres_path, self.superres_bpd)}[which]
        return f"Model `{path}`: val bits/dim {bpd}."

    def saved(self, samples: list[tuple[Image.Image, str]], stem: str, kind: str) -> list[str]:
        """The shown samples as PNG files in a new folder of their own, for the page's downloads."""
        folder = Path(tempfile.mkdtemp(dir=self.downloads.name))
        paths = []
        for i, (image, _) in enumerate(samples):
            path = folder / f"{stem}-{kind}-{i + 1}.png"
            image.save(path, format="PNG")
            paths.append(str(path))
        return paths


def seeded(seed: float | None) -> torch.Generator:
    """A generator seeded with the page's seed (an emptied seed box: seed 0), or a UserError naming
    the range for a seed that is not a whole number of ``SEEDS``."""
    seed = seed or 0
    whole = isinstance(seed, int) or (isinstance(seed, float) and seed.is_integer())  # not nan, not inf
    if not whole or int(seed) not in SEEDS:
        raise UserError(f"seed {seed} cannot seed the sampler: give a whole number from 0 to {SEEDS[-1]}")
    return torch.Generator().manual_seed(int(seed))


def steps_per_row(model: AutoregressiveModel) -> int:
    """Generation steps per image row (32 for DMOL, 96 for categorical 32x32): the page updates once a row."""
    return model.order.length // model.config.image_size


def timed(states: Iterator[Progress]) -> Iterator[tuple[Progress, float]]:
    """(state, seconds spent sampling so far) for each state: the time inside the sampler only,
    not the page's drawing between updates."""
    elapsed = 0.0
    while True:
        started = time.perf_counter()
        state = next(states, None)
        elapsed += time.perf_counter() - started
        if state is None:
            return
        yield state, elapsed


def took(preparing: float, sampling: float) -> str:
    """The time a request took, reading and preparing the picture included, and its parts."""
    return f"{seconds(preparing + sampling)} ({seconds(preparing)} preparing the picture, {seconds(sampling)} of sampling)"


def growing(state: Progress, elapsed: float) -> str:
    return f"sampling: {state.steps} of {state.total} steps, {seconds(elapsed)} so far"


def refused(error: Exception) -> str:
    """The status for a picture or request that cannot be served: the one-line reason."""
    return "**Cannot do that**: " + " ".join(str(error).split())
