"""The PixelCNN++ network (Salimans et al. 2017; the reference is openai/pixel-cnn), written
for this project as a baseline to set beside ``quick`` at equal CPU time.

    net = PixelCNNpp(nr_resnet=1, nr_filters=32, nr_logistic_mix=10)
    params = net(to_model_input(images))        # uint8 (B, 32, 32, 3) -> (B, 1024, 10·K)
    nats = net.head.log_prob(params, images.flatten(1, 2)).sum(1)   # (B,) nats per image

Causality without masks: a down-shifted convolution (kernel 2×3, padded above and on both
sides) sees only rows up to its own, a down-right-shifted one (2×2, padded above and on the
left) only the pixels above and to the left; shifting the first layer's output one row down
(the ``u`` stream, everything above) or one row down plus one column right (the ``ul``
stream, above and to the left) leaves every later layer blind to the pixel itself and all
after it. The network is the paper's U-shaped stack: ``nr_resnet`` gated resnets at 32×32,
16×16 and 8×8 on the way down in resolution (the up pass, its outputs kept), then on the way
back (the down pass) ``nr_resnet`` at 8×8 and ``nr_resnet + 1`` at 16×16 and 32×32, each
taking the kept output of the same place as a shortcut.

The output is the discretised mixture of logistics with channel coupling, scored by the
project's own ``DMOLHead``: its linear map is the paper's final 1×1 ``nin`` on elu(ul), and its
parameter layout (K logits, then per channel K means, K log-scales, K coefficients) is the
reference's, so no reordering is needed. Every layer has weight normalisation (as the paper;
without its data-dependent initialisation: the scale starts at the norm of the initial
weights, so the network starts as its un-normalised self).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from imagetx.model.config import CHANNELS, HALF_RANGE
from imagetx.model.heads import DMOLHead


def to_model_input(images: Tensor) -> Tensor:
    """uint8 (B, H, W, 3) -> float (B, 3, H, W) on [-1, 1], the scale the project's models
    read pixels on (``PixelEmbedding``) and the DMOL head places its bins on."""
    return rearrange(images, "b h w c -> b c h w").float() / HALF_RANGE - 1.0


def concat_elu(x: Tensor) -> Tensor:
    """ELU of x and of −x side by side (the paper's resnet non-linearity): nothing is cut off."""
    return F.elu(torch.cat([x, -x], dim=1))


def down_shift(x: Tensor) -> Tensor:
    """Every row one row down, a row of zeros on top: position (i, j) holds what was at (i−1, j)."""
    return F.pad(x, (0, 0, 1, 0))[:, :, :-1, :]


def right_shift(x: Tensor) -> Tensor:
    """Every column one column right, zeros on the left: (i, j) holds what was at (i, j−1)."""
    return F.pad(x, (1, 0, 0, 0))[:, :, :, :-1]


class DownShiftedConv(nn.Module):
    """A conv that sees its own row and the rows above (kernel (kh, kw), kw odd, centred):
    padded kh−1 rows above and (kw−1)/2 columns each side. Stride 2 halves the image."""

    def __init__(self, c_in: int, c_out: int, kernel: tuple[int, int] = (2, 3), stride: int = 1) -> None:
        super().__init__()
        kh, kw = kernel
        self.pad = ((kw - 1) // 2, (kw - 1) // 2, kh - 1, 0)  # (left, right, top, bottom)
        self.conv = weight_norm(nn.Conv2d(c_in, c_out, kernel, stride=stride))

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, self.pad))


class DownRightShiftedConv(nn.Module):
    """A conv that sees its own position, the columns left of it and the rows above:
    padded kh−1 rows above and kw−1 columns on the left."""

    def __init__(self, c_in: int, c_out: int, kernel: tuple[int, int] = (2, 2), stride: int = 1) -> None:
        super().__init__()
        kh, kw = kernel
        self.pad = (kw - 1, 0, kh - 1, 0)
        self.conv = weight_norm(nn.Conv2d(c_in, c_out, kernel, stride=stride))

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, self.pad))


def transposed(c_in: int, c_out: int, kernel: tuple[int, int]) -> nn.ConvTranspose2d:
    """A stride-2 transposed conv with the reference's 'VALID' output, (2H + kh − 1, 2W + kw − 1)
    (``output_padding`` 1 adds the last row and column that PyTorch leaves off), weight-normed
    per output channel: a transposed conv's weight is (in, out, kh, kw), hence dim 1."""
    return weight_norm(nn.ConvTranspose2d(c_in, c_out, kernel, stride=2, output_padding=1), dim=1)


class ShiftedDeconv(nn.Module):
    """Doubles the image, then keeps the first 2H rows (those that read only the rows at or
    above them) and 2W columns: the centred ones, the transposed counterpart of
    ``DownShiftedConv``, or with ``right`` the first ones (those that read only positions to
    the left), the counterpart of ``DownRightShiftedConv``."""

    def __init__(self, c_in: int, c_out: int, kernel: tuple[int, int], right: bool) -> None:
        super().__init__()
        self.kernel, self.right = kernel, right
        self.deconv = transposed(c_in, c_out, kernel)

    def forward(self, x: Tensor) -> Tensor:
        kh, kw = self.kernel
        y = self.deconv(x)  # (B, C, 2H + kh − 1, 2W + kw − 1)
        left = 0 if self.right else (kw - 1) // 2
        return y[:, :, : y.shape[2] - kh + 1, left : left + y.shape[3] - kw + 1]


class GatedResnet(nn.Module):
    """x + a·σ(b), [a, b] = conv(concat_elu(conv(concat_elu(x)) + nin(concat_elu(shortcut))));
    ``conv`` is the stream's shifted conv class, ``shortcut_channels`` 0 for none."""

    def __init__(self, filters: int, conv: type[nn.Module], shortcut_channels: int = 0, dropout: float = 0.0) -> None:
        super().__init__()
        self.conv_in = conv(2 * filters, filters)
        # The shortcut's nin: a 1×1 conv, weight-normed like every other layer.
        self.nin = weight_norm(nn.Conv2d(2 * shortcut_channels, filters, 1)) if shortcut_channels else None
        self.dropout = nn.Dropout(dropout)
        self.conv_out = conv(2 * filters, 2 * filters)

    def forward(self, x: Tensor, shortcut: Tensor | None = None) -> Tensor:
        h = self.conv_in(concat_elu(x))
        if self.nin is not None:
            h = h + self.nin(concat_elu(shortcut))
        a, b = self.conv_out(self.dropout(concat_elu(h))).chunk(2, dim=1)
        return x + a * torch.sigmoid(b)


class PixelCNNpp(nn.Module):
    """PixelCNN++: (B, 3, H, W) on [-1, 1] -> DMOL parameters (B, H·W, 10·K), position t = i·W + j
    given only the pixels before it in raster order (all three channels of each).

    ``dropout``: the paper's CIFAR-10 model uses 0.5 against overfitting over hundreds of
    epochs; a small model trained for minutes sees each image at most a few times, hence 0 here."""

    def __init__(self, nr_resnet: int = 1, nr_filters: int = 32, nr_logistic_mix: int = 10,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.nr_resnet, f = nr_resnet, nr_filters
        inputs = CHANNELS + 1  # the image and a channel of ones, so that zero padding differs from black-ish pixels

        def u_resnet(shortcut: int = 0) -> GatedResnet:
            return GatedResnet(f, DownShiftedConv, shortcut, dropout)

        def ul_resnet(shortcut: int) -> GatedResnet:
            return GatedResnet(f, DownRightShiftedConv, shortcut, dropout)

        self.u_first = DownShiftedConv(inputs, f, (2, 3))
        self.ul_first_above = DownShiftedConv(inputs, f, (1, 3))
        self.ul_first_left = DownRightShiftedConv(inputs, f, (2, 1))
        stages = 3  # 32×32, 16×16, 8×8
        # Up pass: u resnets alone, ul resnets reading u as a shortcut; a stride-2 conv between stages.
        self.up_u = nn.ModuleList(nn.ModuleList(u_resnet() for _ in range(nr_resnet)) for _ in range(stages))
        self.up_ul = nn.ModuleList(nn.ModuleList(ul_resnet(f) for _ in range(nr_resnet)) for _ in range(stages))
        self.down_u_conv = nn.ModuleList(DownShiftedConv(f, f, (2, 3), stride=2) for _ in range(stages - 1))
        self.down_ul_conv = nn.ModuleList(DownRightShiftedConv(f, f, (2, 2), stride=2) for _ in range(stages - 1))
        # Down pass: u reads the kept u; ul reads [u, kept ul]; nr_resnet + 1 after each upsampling
        # (one more kept output there: the stride-2 conv's).
        counts = [nr_resnet, nr_resnet + 1, nr_resnet + 1]
        self.down_u = nn.ModuleList(nn.ModuleList(u_resnet(f) for _ in range(n)) for n in counts)
        self.down_ul = nn.ModuleList(nn.ModuleList(ul_resnet(2 * f) for _ in range(n)) for n in counts)
        self.up_u_deconv = nn.ModuleList(ShiftedDeconv(f, f, (2, 3), right=False) for _ in range(stages - 1))
        self.up_ul_deconv = nn.ModuleList(ShiftedDeconv(f, f, (2, 2), right=True) for _ in range(stages - 1))
        self.head = DMOLHead(f, nr_logistic_mix)
        weight_norm(self.head.proj)  # the final nin, weight-normed as the rest

    def forward(self, x: Tensor) -> Tensor:
        ones = torch.ones_like(x[:, :1])
        x = torch.cat([x, ones], dim=1)
        u_kept = [down_shift(self.u_first(x))]
        ul_kept = [down_shift(self.ul_first_above(x)) + right_shift(self.ul_first_left(x))]
        for stage in range(len(self.up_u)):
            if stage:
                u_kept.append(self.down_u_conv[stage - 1](u_kept[-1]))
                ul_kept.append(self.down_ul_conv[stage - 1](ul_kept[-1]))
            for u_block, ul_block in zip(self.up_u[stage], self.up_ul[stage]):
                u_kept.append(u_block(u_kept[-1]))
                ul_kept.append(ul_block(ul_kept[-1], u_kept[-1]))
        u, ul = u_kept.pop(), ul_kept.pop()
        for stage in range(len(self.down_u)):
            if stage:
                u = self.up_u_deconv[stage - 1](u)
                ul = self.up_ul_deconv[stage - 1](ul)
            for u_block, ul_block in zip(self.down_u[stage], self.down_ul[stage]):
                u = u_block(u, u_kept.pop())
                ul = ul_block(ul, torch.cat([u, ul_kept.pop()], dim=1))
        assert not u_kept and not ul_kept  # every kept output used once, as the reference asserts
        return self.head(rearrange(F.elu(ul), "b f h w -> b (h w) f"))

    def nats(self, images: Tensor) -> Tensor:
        """uint8 (B, H, W, 3) -> (B,) negative log-likelihood of each image, in nats."""
        params = self(to_model_input(images))
        return -self.head.log_prob(params, images.flatten(1, 2)).sum(1)
