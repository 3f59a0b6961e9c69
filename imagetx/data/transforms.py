"""Distribution augmentation (Jun et al., "Distribution Augmentation for Generative Modeling", ICML 2020):
training images transformed at random by exact symmetries of the pixel grid and of the colour channels, the
transform's id given to the model as a conditioning input (as a class is), and scoring with the identity.

The transforms are the dihedral group of the square (4 rotations by 90°, each with or without a transposition
first) times the 6 orders of the colour channels: 48 in all, each a permutation of a uint8 image's values
(exact: no interpolation, nothing rounded), each with one id in 0..47 that a model embeds whatever set a run
draws from, so that one name is one id everywhere (training, ``imagetx.sample --transform``):

    id = 6 · (4 · transposed + quarter_turns) + channel_order        id 0: the identity

A set (``--data.transforms``) is a product of factors joined by ``+`` (``rotations``, ``transposition``,
``channels``: the paper's sets and their combinations, e.g. ``rotations+channels``: 24 transforms); a transform
is named by its parts joined by ``+`` (``identity``, ``rot90``, ``transpose+rot180``, ``bgr``, ``rot90+gbr``).
"""

from __future__ import annotations

from itertools import permutations, product

import torch

from .sources import DataError

CHANNEL_ORDERS = tuple(permutations(range(3)))  # (0, 1, 2) first: the identity
CHANNEL_NAMES = tuple("".join("rgb"[c] for c in order) for order in CHANNEL_ORDERS)
QUARTER_TURNS = 4
COUNT = 2 * QUARTER_TURNS * len(CHANNEL_ORDERS)  # the ids a model with distribution augmentation embeds: 48

# A set's factors: the (transposed, quarter turns, channel order) values each ranges over (the others stay 0).
FACTORS = {"rotations": ("turns", range(QUARTER_TURNS)), "transposition": ("transposed", range(2)),
           "channels": ("channels", range(len(CHANNEL_ORDERS)))}


def transform_id(transposed: int, turns: int, channels: int) -> int:
    return len(CHANNEL_ORDERS) * (QUARTER_TURNS * transposed + turns) + channels


def parts(transform: int) -> tuple[int, int, int]:
    """(transposed, quarter turns, channel order) of an id."""
    spatial, channels = divmod(transform, len(CHANNEL_ORDERS))
    return (*divmod(spatial, QUARTER_TURNS), channels)


def apply(image: torch.Tensor, transform: int) -> torch.Tensor:
    """``image`` (H, W, 3) uint8 under the transform: transposed (rows for columns), then turned counter-clockwise
    by quarter turns, then its channels reordered; the same values in other places (a copy where any moved)."""
    transposed, turns, channels = parts(transform)
    if transposed:
        image = image.transpose(0, 1)
    if turns:
        image = torch.rot90(image, turns, dims=(0, 1))
    if channels:
        image = image[..., list(CHANNEL_ORDERS[channels])]
    return image.contiguous()


def invert(image: torch.Tensor, transform: int) -> torch.Tensor:
    """The image ``apply(original, transform)`` came from: each step undone in reverse order."""
    transposed, turns, channels = parts(transform)
    if channels:
        image = image[..., [CHANNEL_ORDERS[channels].index(c) for c in range(3)]]
    if turns:
        image = torch.rot90(image, -turns, dims=(0, 1))
    if transposed:
        image = image.transpose(0, 1)
    return image.contiguous()


def name(transform: int) -> str:
    transposed, turns, channels = parts(transform)
    words = ["transpose"] * transposed + [f"rot{90 * turns}"] * bool(turns) + [CHANNEL_NAMES[channels]] * bool(channels)
    return "+".join(words) or "identity"


NAMES = {name(transform): transform for transform in range(COUNT)}


def parse_transform(given: str) -> int:
    """A transform's id from its name (``rot90+bgr``) or its id (``7``); anything else refused in one line."""
    if given.isdigit() and int(given) < COUNT:
        return int(given)
    if given not in NAMES:
        raise DataError(f"--transform {given!r}: not a transform; give an id 0..{COUNT - 1} or a name such as "
                        "identity, rot90, transpose, bgr, transpose+rot180+gbr")
    return NAMES[given]


def transform_set(spec: str) -> tuple[int, ...]:
    """The ids of a set named by factors joined by ``+`` (``rotations+channels``), identity first."""
    factors = spec.split("+")
    unknown = [factor for factor in factors if factor not in FACTORS]
    if unknown or len(set(factors)) != len(factors):
        raise DataError(f"--data.transforms {spec!r}: give distinct factors of {', '.join(FACTORS)} joined by + "
                        "(e.g. rotations+channels)")
    ranges = {"transposed": range(1), "turns": range(1), "channels": range(1)}
    ranges.update(FACTORS[factor] for factor in factors)
    return tuple(sorted(transform_id(*values) for values in
                        product(ranges["transposed"], ranges["turns"], ranges["channels"])))


class TransformDraw:
    """Each training image's transform in one epoch: uniform over the set, or the identity with probability
    ``identity_probability`` and the set's others uniform in the rest (the paper keeps some images as they are)."""

    def __init__(self, spec: str, identity_probability: float | None = None) -> None:
        if identity_probability is not None and not 0.0 <= identity_probability <= 1.0:
            raise DataError(f"--data.identity_probability {identity_probability}: give a probability in [0, 1]")
        self.ids = torch.tensor(transform_set(spec))
        self.identity_probability = identity_probability

    def __call__(self, count: int, generator: torch.Generator) -> list[int]:
        """``count`` ids drawn from ``generator`` (the training order's: a function of (seed, epoch))."""
        if self.identity_probability is None:
            return self.ids[torch.randint(len(self.ids), (count,), generator=generator)].tolist()
        identity = torch.rand(count, generator=generator) < self.identity_probability
        others = self.ids[1:][torch.randint(len(self.ids) - 1, (count,), generator=generator)]
        return torch.where(identity, 0, others).tolist()
