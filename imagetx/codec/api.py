"""``compress`` and ``decompress``: images <-> one file's bytes with a model (docs/compress.md).

    data = compress(model, images)            # (N, H, W, 3) uint8, H = W = the model's size
    assert (decompress(model, data) == images).all()

All images of a file are coded in one decoding pass (every image stepped together), up to
``MAX_BATCH`` of them; a larger file, or a smaller ``batch``, in passes of ``batch`` images (the
last takes what is left), all into one range-coded stream. The header records the passes' size
and the torch threads, which the decoder uses again, and the arithmetic (arithmetic.py): a file
coded with portable arithmetic decodes on any x86-64 machine with the same torch, so ``compress``
asks for it unless told ``portable=False``. Given ``names`` (a stem an image: what the compress
command gives, its input files' stems), the file keeps those that are safe file names
(names.py), and a decompressed folder takes them back; without (images from Python), it keeps
none, and a folder numbers them, as before format 5. ``read_header(data).names`` holds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import constriction
import numpy as np
import torch

from ..model.transformer import AutoregressiveModel, ImageTransformer
from .arithmetic import PORTABLE_COMMAND, Arithmetic, current, not_portable_reason
from .coder import PayloadDecoder, decode_values, encode_values, progress_bar, torch_threads
from .container import (FORMAT_VERSION, MAX_BATCH, MAX_IMAGES, MAX_THREADS, Checked, CodecError, Header, checked,
                        model_fingerprint, pack, pixel_digest)
from .distributions import PRECISION
from .names import kept_names

# One torch thread by default, as sampling on a CPU (model/sampler.py's DECODING_THREADS): the
# file records it, and the decoder must use the same.
DEFAULT_THREADS = 1


@dataclass(frozen=True)
class CompressionStats:
    """What ``compress_with_stats`` measured: the file's bytes, and the cost of the images under
    the quantised distributions in bits, the sum of -log2(frequency / 2**24): what the range
    coder spends on them (no header), up to its own rounding and last words (docs/compress.md:
    82 bits over 200 CIFAR-10 images)."""

    images: int
    file_bytes: int
    ideal_bits: float
    dims: int
    payload_bytes: int  # the range coder's words: the rest of the file is its header, names list and CRC

    @property
    def bits_per_dim(self) -> float:
        return 8 * self.file_bytes / self.dims


def check_model(model: AutoregressiveModel) -> None:
    """A model the codec can drive: unconditional, without a low-resolution input, on the CPU."""
    cfg = model.config
    if cfg.num_classes or cfg.superres:
        raise CodecError("compression needs an unconditional model (no classes, no low-resolution encoder): "
                         "this one would need the labels or the 8x8 images coded too")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise CodecError(f"the codec runs on the CPU (bit-exact on one machine); the model is on {device}")


def check_images(model: ImageTransformer, images: np.ndarray | torch.Tensor) -> np.ndarray:
    """(N, S, S, 3) uint8 pixels for a model of side S, as a numpy array, or a CodecError."""
    array = images.numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    size = model.config.image_size
    if array.ndim != 4 or array.shape[-1] != 3:
        raise CodecError(f"images must be (N, H, W, 3) RGB, not of shape {tuple(array.shape)}")
    if array.dtype != np.uint8:
        raise CodecError(f"images must be uint8 pixels, not {array.dtype}")
    if array.shape[1:3] != (size, size):
        raise CodecError(f"images are {array.shape[2]}x{array.shape[1]}; this model codes {size}x{size} images "
                         "exactly, and compression is lossless: nothing is resized (crop or resize them first)")
    if not 1 <= array.shape[0] <= MAX_IMAGES:
        raise CodecError(f"{array.shape[0]} images: a file holds 1..{MAX_IMAGES:,}")
    return np.ascontiguousarray(array)


def groups(count: int, batch: int) -> list[slice]:
    return [slice(start, min(start + batch, count)) for start in range(0, count, batch)]


def compress_with_stats(model: ImageTransformer, images: np.ndarray | torch.Tensor, batch: int | None = None,
                        threads: int = DEFAULT_THREADS, progress: bool = False, portable: bool = True,
                        names: Sequence[str] | None = None) -> tuple[bytes, CompressionStats]:
    """``compress``, and what it measured."""
    check_model(model)
    pixels = check_images(model, images)
    if names is not None and (len(names) != len(pixels) or not all(isinstance(name, str) for name in names)):
        raise CodecError(f"names: give one str for each of the {len(pixels)} images, not {len(names)} of them")
    arithmetic = current()
    if portable and not arithmetic.portable:
        raise CodecError(f"{not_portable_reason(arithmetic)}; or pass portable=False (--portable false) for a file "
                         "coded for this kind of machine only")
    count, size = pixels.shape[0], model.config.image_size
    batch = min(count, MAX_BATCH) if batch is None else batch
    if not 1 <= batch <= MAX_BATCH or not 1 <= threads <= MAX_THREADS:
        raise CodecError(f"batch {batch} and threads {threads}: give 1..{MAX_BATCH} and 1..{MAX_THREADS}")
    encoder = constriction.stream.queue.RangeEncoder()
    ideal = 0.0
    parts = groups(count, batch)
    with torch_threads(threads), progress_bar(len(parts) * model.order.length, "compressing", progress) as bar:
        for part in parts:
            targets = model.targets(torch.from_numpy(pixels[part]))
            ideal += encode_values(model, targets, encoder, FORMAT_VERSION, bar)
    payload = encoder.get_compressed().astype("<u4").tobytes()
    header = Header(FORMAT_VERSION, PRECISION, threads, model.config.head, count, size, size, min(batch, count),
                    model_fingerprint(model), pixel_digest(pixels), arithmetic,
                    kept_names(names) if names is not None else ())
    data = pack(header, payload)
    return data, CompressionStats(count, len(data), ideal, count * model.config.dims_per_image, len(payload))


def compress(model: ImageTransformer, images: np.ndarray | torch.Tensor, batch: int | None = None,
             threads: int = DEFAULT_THREADS, progress: bool = False, portable: bool = True,
             names: Sequence[str] | None = None) -> bytes:
    """(N, S, S, 3) uint8 images -> the compressed file's bytes, for a model of side S: in one
    decoding pass (``batch`` None: up to ``MAX_BATCH`` images) or in passes of ``batch``. With
    ``portable`` (the default) the process must compute with portable arithmetic (a CodecError
    says how otherwise), and the file decodes on any x86-64 machine with the same torch; without,
    it is coded with this machine's own kernels and decodes where they are the same. ``names``
    (one stem an image, optional): the names a decompressed folder gives them (names.py)."""
    return compress_with_stats(model, images, batch, threads, progress, portable, names)[0]


def read_header(data: bytes | Checked) -> Header:
    """The header of a compressed file, checked (``container.unpack``)."""
    return checked(data).header


def decompress(model: ImageTransformer, data: bytes | Checked, progress: bool = False) -> np.ndarray:
    """A compressed file's bytes -> its (N, S, S, 3) uint8 images, exactly; a CodecError (one
    line) for a file that is not one, is truncated or damaged, was written with another model or
    with other arithmetic than this process's, or whose decoding does not reproduce the pixels it
    was made from."""
    file = checked(data)  # a file read by container.read_file: its payload is read below, once it is needed
    header = file.header
    here = current()
    refusal = other_arithmetic(header.arithmetic, here)
    if refusal is not None:
        raise CodecError(refusal)
    size = model.config.image_size
    if header.fingerprint != model_fingerprint(model):
        raise CodecError("the file was compressed with another model (its model fingerprint "
                         f"{header.fingerprint.hex()} is not this model's {model_fingerprint(model).hex()}): "
                         "decompress with the model that compressed it")
    if header.head != model.config.head or (header.height, header.width) != (size, size) \
            or header.precision != PRECISION:
        raise CodecError("the file's header does not fit this model (head, image size or precision)")
    decoder = PayloadDecoder(np.frombuffer(file.payload(), dtype="<u4").astype(np.uint32, copy=False))
    images = []
    parts = groups(header.count, header.batch)
    with torch_threads(header.threads), progress_bar(len(parts) * model.order.length, "decompressing",
                                                     progress) as bar:
        for part in parts:
            try:
                values = decode_values(model, part.stop - part.start, decoder, header.version, bar)
            except CodecError as error:
                raise CodecError(not_decoded(str(error), header, here)) from None
            images.append(model.images(values).to(torch.uint8).numpy())
    pixels = np.concatenate(images)
    if pixel_digest(pixels) != header.digest:
        raise CodecError(not_decoded("the decoded pixels do not match its checksum", header, here))
    return pixels


def other_arithmetic(recorded: Arithmetic | None, here: Arithmetic) -> str | None:
    """Why a file coded with ``recorded`` arithmetic cannot decode in this process, said before any
    decoding (which would otherwise run to its end to fail), or None: the other kind (portable or
    native), or native kernels of another kind (another architecture or ATen capability, whose
    floating point differs; MKL's native path, which the file does not record, follows the CPU)."""
    if recorded is None:  # formats 1 and 2: native kernels, not recorded
        return None
    if recorded.portable != here.portable:
        fix = (f"start Python with {PORTABLE_COMMAND} in the environment" if recorded.portable
               else "decode it without those settings on a machine like the one that coded it")
        fix += " (imagetx-decompress does)"
    elif not recorded.portable and (recorded.machine, recorded.kernels) != (here.machine, here.kernels):
        fix = ("a file of native kernels decodes only where they are the same: decompress it on a machine like "
               "the one that coded it")
    else:
        return None
    return f"the file was coded with {recorded} and this process computes with {here}: {fix}"


def not_decoded(symptom: str, header: Header, here: Arithmetic) -> str:
    """The one line for a file whose CRC and model hold but which did not decode: the arithmetic
    it was coded with against this process's."""
    if header.arithmetic is None:
        why = (f"the file (format {header.version}) was coded with the native kernels of the machine that made "
               "it, which the format did not record: decompress it on that kind of machine")
    elif header.arithmetic != here:
        why = (f"it was coded with other arithmetic, {header.arithmetic}, where this process computes with "
               f"{here}: decompress it where they are the same")
    else:
        why = (f"it records this process's arithmetic ({here}), so it was crafted, or floating point on the "
               "machine that coded it differed in a way the arithmetic does not record (docs/compress.md)")
    return f"the file does not decode here ({symptom}): {why}"
