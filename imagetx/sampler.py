"""Cached incremental sampling (SPEC §7): one generation step at a time through all layers.

Each self-attention layer keeps a ring buffer of keys and values just long enough
for the oldest key any later query can still see (for 1D local attention with one
memory block: 2·lq positions, not the whole image). Which cached keys step t sees is
read off the pattern's own ``can_attend`` matrix, so the cached path and the full
teacher-forced pass share one definition of locality; tests check they agree.
Cross-attention keys/values over the encoder output are computed once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from .heads import check_temperature
from .model import ImageTransformer
from .order import sequence_to_images


class StepIndex:
    """For every step t: the ring-buffer slots of the keys it may see, and which are real."""

    def __init__(self, can_attend: Tensor) -> None:
        length = can_attend.shape[0]
        steps = torch.arange(length)
        counts = can_attend.sum(1)
        width = int(counts.max())
        # Stable sort puts each row's allowed keys first, in ascending order.
        order = torch.argsort((~can_attend).to(torch.uint8), dim=1, stable=True)[:, :width]
        self.valid = torch.arange(width)[None, :] < counts[:, None]  # (T, width)
        key_steps = torch.where(self.valid, order, steps[:, None])
        oldest = key_steps.min(dim=1).values
        self.ring = int((steps - oldest).max()) + 1  # positions a layer must keep
        self.slots = key_steps % self.ring  # (T, width)

    def to(self, device: torch.device) -> "StepIndex":
        self.valid, self.slots = self.valid.to(device), self.slots.to(device)
        return self


class CachedDecoder:
    """Incremental decoder over a model in eval mode; ``step(t, previous)`` -> (B, P) parameters."""

    def __init__(self, model: ImageTransformer, batch: int, labels: Tensor | None = None,
                 low_res: Tensor | None = None) -> None:
        self.model = model
        device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.index = StepIndex(model.pattern.can_attend()).to(device)
        cfg = model.config
        heads, head_dim = cfg.n_heads, cfg.head_dim
        self.keys = [torch.zeros(batch, heads, self.index.ring, head_dim, device=device, dtype=dtype)
                     for _ in model.layers]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.positions = model.positions(model.step_rows, model.step_cols)  # (T, d)
        self.class_vector = model.condition(labels)  # (B, 1, d) or None
        self.start = torch.zeros(batch, 1, cfg.d_model, device=device, dtype=dtype)
        context = model.encode(low_res)
        self.remainder = model.cell_remainder
        if self.remainder is not None:  # running sums of each cell's values generated so far
            self.remainder_low = self.remainder.low_res_values(low_res)  # (B, T, c)
            self.remainder_sums = torch.zeros(batch, self.remainder.n_groups, self.remainder_low.shape[-1],
                                              device=device, dtype=self.remainder.sum_dtype)
        self.cross_kv = None
        if context is not None:
            self.cross_kv = [(layer.cross_attn.split_heads(layer.cross_attn.to_k(context)),
                              layer.cross_attn.split_heads(layer.cross_attn.to_v(context)))
                             for layer in model.layers]

    def _self_attend(self, layer_index: int, hidden: Tensor, t: int) -> Tensor:
        attn = self.model.layers[layer_index].self_attn
        q = attn.split_heads(attn.to_q(hidden))  # (B, h, 1, d)
        slot = t % self.index.ring
        self.keys[layer_index][:, :, slot] = attn.split_heads(attn.to_k(hidden))[:, :, 0]
        self.values[layer_index][:, :, slot] = attn.split_heads(attn.to_v(hidden))[:, :, 0]
        slots = self.index.slots[t]
        keys = self.keys[layer_index][:, :, slots]
        values = self.values[layer_index][:, :, slots]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=self.index.valid[t : t + 1])
        return attn.merge_heads(out)

    def _cross_attend(self, layer_index: int, hidden: Tensor, t: int) -> Tensor:
        attn = self.model.layers[layer_index].cross_attn
        keys, values = self.cross_kv[layer_index]
        local = self.model.cross_can_attend
        can_attend = None if local is None else local[t : t + 1]
        q = attn.split_heads(attn.to_q(hidden))
        return attn.merge_heads(F.scaled_dot_product_attention(q, keys, values, attn_mask=can_attend))

    def step(self, t: int, previous: Tensor | None) -> Tensor:
        """Parameters for step t, given the embedding (B, 1, d) of step t−1's value (None at t = 0)."""
        x = (self.start if previous is None else previous) + self.positions[t]
        if self.class_vector is not None:
            x = x + self.class_vector
        if self.remainder is not None:
            group = self.remainder.groups[t]
            x = x + self.remainder.features(self.remainder_sums[:, group, None], self.remainder_low[:, t : t + 1],
                                            self.remainder.still_to_come[t : t + 1])
        for i, layer in enumerate(self.model.layers):
            x = layer.sublayer(x, lambda h: self._self_attend(i, h, t), layer.self_norm)
            if self.cross_kv is not None:
                x = layer.sublayer(x, lambda h: self._cross_attend(i, h, t), layer.cross_norm)
            x = layer.sublayer(x, layer.ffn, layer.ffn_norm)
        return self.model.head(self.model.final_norm(x))[:, 0]

    def embed_step(self, t: int, value: Tensor) -> Tensor:
        """Embedding (B, 1, d) of the value (B,) or (B, 3) generated at step t."""
        model = self.model
        if self.remainder is not None:
            self.remainder_sums[:, self.remainder.groups[t]] += self.remainder.step_values(value)
        if model.config.head == "categorical":
            return model.value_embedding(value[:, None], model.step_channels[t : t + 1])
        return model.value_embedding(value[:, None, :])


def check_sampling_request(model: ImageTransformer, count: int, labels: Tensor | None,
                           temperature: float) -> None:
    if count < 1:
        raise ValueError(f"number of images {count} is invalid: ask for at least 1")
    check_temperature(temperature)
    classes = model.config.num_classes
    if classes and labels is None:
        raise ValueError(f"this model is class-conditional: give a label in 0..{classes - 1} per image")
    if not classes and labels is not None:
        raise ValueError("this model is unconditional (num_classes=0): give no class label")
    if labels is not None and (labels.shape != (count,) or labels.min() < 0 or labels.max() >= classes):
        raise ValueError(f"labels {labels.tolist()} are invalid: give {count} labels in 0..{classes - 1}")


@torch.no_grad()
def sample(
    model: ImageTransformer,
    count: int,
    labels: Tensor | None = None,
    low_res: Tensor | None = None,
    temperature: float = 1.0,
    prefix: Tensor | None = None,
    given_rows: int = 0,
    generator: torch.Generator | None = None,
    progress: bool = False,
) -> Tensor:
    """Generate ``count`` images (count, H, W, 3) uint8 with the cache.

    With ``prefix`` images and ``given_rows`` = k, every cell in the first k image
    rows is teacher-forced to the prefix's value (image completion, SPEC §6); the
    rest is sampled. In 2D block-raster order, given cells that come after sampled
    ones are still forced when their step comes.
    """
    check_sampling_request(model, count, labels, temperature)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    if not 0 <= given_rows <= model.config.image_size:
        raise ValueError(f"given_rows={given_rows} is invalid: use 0..{model.config.image_size}")
    if given_rows and (prefix is None or prefix.shape[0] != count):
        raise ValueError(f"completion needs prefix images of shape ({count}, H, W, 3) for given_rows={given_rows}")
    given = model.step_rows < given_rows  # (T,) which steps are given; grid rows are image rows
    forced = model.targets(prefix.to(device)) if prefix is not None and given_rows else None
    decoder = CachedDecoder(model, count, labels, low_res)
    previous, values = None, []
    for t in tqdm(range(model.order.length), desc="sampling", unit="step", disable=not progress, leave=False):
        params = decoder.step(t, previous)
        if forced is not None and bool(given[t]):
            value = forced[:, t]
        else:
            value = model.head.sample(params[:, None], temperature, generator)[:, 0]
        values.append(value)
        previous = decoder.embed_step(t, value)
    model.train(was_training)
    sequence = torch.stack(values, dim=1)
    return sequence_to_images(sequence, model.order, model.config.head).to(torch.uint8)


@torch.no_grad()
def sample_uncached(model: ImageTransformer, count: int, labels: Tensor | None = None,
                    low_res: Tensor | None = None, temperature: float = 1.0, steps: int | None = None,
                    generator: torch.Generator | None = None) -> Tensor:
    """The original's method, for comparison: rerun the whole network at every step.

    ``steps`` stops early (the benchmark times a few steps and extrapolates).
    """
    check_sampling_request(model, count, labels, temperature)
    model.eval()
    device = next(model.parameters()).device
    cfg = model.config
    images = torch.zeros(count, cfg.image_size, cfg.image_size, 3, dtype=torch.uint8, device=device)
    sequence = model.targets(images)
    for t in range(model.order.length if steps is None else steps):
        params = model(sequence_to_images(sequence, model.order, cfg.head).to(torch.uint8), labels, low_res)
        sequence[:, t] = model.head.sample(params[:, t : t + 1], temperature, generator)[:, 0]
    return sequence_to_images(sequence, model.order, cfg.head).to(torch.uint8)
