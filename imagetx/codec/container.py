"""The compressed file: a header that says what it holds and with which model, the range
coder's words, and a checksum (docs/compress.md, "The file").

    offset  bytes  field (little-endian)
    0       4      magic b"ITXC"
    4       1      format version (FORMAT_VERSION; READ_VERSIONS are decoded)
    5       1      probability precision in bits (distributions.PRECISION)
    6       1      torch threads the decoding ran on
    7       1      head: 0 categorical, 1 DMOL
    8       4      image count N
    12      2      image height
    14      2      image width
    16      2      batch: images coded together in one decoding pass (the last pass takes the rest)
    18      16     model fingerprint: SHA-256 of the config and every weight, first 16 bytes
    34      8      pixel digest: SHA-256 of the N·H·W·3 uint8 pixels, first 8 bytes
    42      4      payload length in bytes
    46      1      the arithmetic (format 3 on): 1 portable, 0 native (arithmetic.py)
    47      16     the machine's architecture, ASCII, zero-padded (x86_64)
    63      16     ATen's CPU kernels, ASCII, zero-padded (DEFAULT, AVX2, AVX512)
    79      32     the torch version, ASCII, zero-padded (2.14.1+cu130)
    111     4      names' length L in bytes (format 5 on; names.py)
    115     L      the images' names: UTF-8, one an image, separated by NUL bytes (format 5), or
                   packed (format 6 on: names_list.py); L = 0: none
    ...     ...    payload: the range coder's 32-bit words (from offset 46 in formats 1 and 2,
                   111 in formats 3 and 4)
    end-4   4      CRC-32 of everything before it

A truncated, extended or damaged file fails the length or the CRC before anything is decoded,
and so does a header claiming more images than its payload can code (``least_bits``,
``payload_bits``); a file for another model fails the fingerprint; a decoding that went wrong
anyway (a file coded with other arithmetic, or crafted) fails the coder, reads past the payload's
end (coder.PayloadDecoder: refused there) or fails the pixel digest. A file on disk is read in
pieces (``read_file``): a refusal before the decoding never holds the whole file in memory. Each is a ``CodecError`` with
one line saying which. A names list that is not one (not UTF-8, another count of names than of
images) is refused too; a name that is not a safe file name is the decompressor's to refuse
(names.py).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from ..errors import UserError
from . import names_list
from .names import MAX_NAME_BYTES

if TYPE_CHECKING:  # torch's modules, imported where used: the commands read limits and CodecError before torch
    from ..model.transformer import ImageTransformer
    from .arithmetic import Arithmetic

MAGIC = b"ITXC"
# Version 7 has 6's layout; its decoder's self-attention reads each step's query block's keys, the
# model's own decoding, where 1 to 6 attended over a whole ring (whole_ring.py, BLOCK_KEYS_VERSION).
# Version 6 packs the names list (names_list.py: an npz's names in a few bytes, not 11 an image) and
# computes the DMOL head's coupling coefficients' tanh with float64.py too (coder.py, OWN_TANH_VERSION).
# Version 5 has 4's coding and adds the images' names (NAMES_VERSION). Version 4 has 3's layout; its distributions are computed without libm (float64.py), where 3 and
# earlier computed them with torch's float64 functions (coder.py, LIBM_FREE_VERSION). Version 3
# records the arithmetic the file was coded with. Version 2 coded with exactly the quantised
# frequencies, as 3 does; version 1 had constriction re-quantise them (coder.py,
# REQUANTISED_VERSION). Files of 1 to 4 are still decoded, as they were coded (without names).
FORMAT_VERSION = 7
READ_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
ARITHMETIC_VERSION = 3  # the first format that records the arithmetic
NAMES_VERSION = 5  # the first format that keeps the images' names
PACKED_NAMES_VERSION = 6  # the first format that packs them (names_list.py)
HEADER = struct.Struct("<4sBBBBIHHH16s8sI")
ARITHMETIC = struct.Struct("<B16s16s32s")
NAMES_LENGTH = struct.Struct("<I")
NAME_SEPARATOR = b"\0"
TRAILER = struct.Struct("<I")
HEADS = ("categorical", "dmol")
# 16 bytes (128 bits) of SHA-256 name a model: two different models share a fingerprint with
# chance 2**-128. 8 bytes of the pixels' SHA-256: a wrong decoding passes with chance 2**-64.
FINGERPRINT_BYTES = 16
DIGEST_BYTES = 8
# Limits a file's header may claim, so that a crafted header cannot ask for unbounded memory:
# 100,000 images of 32×32 are 300 MB of pixels; 1,024 images in one pass keep the decoding
# caches of the shipped model (2 layers, a 64-slot ring of d=128 keys and values) near 130 MB.
MAX_IMAGES = 100_000
MAX_BATCH = 1024
MAX_THREADS = 64
# A file's images are (N, H, W, RGB) uint8 (as pixel_digest hashes them): every sub-pixel is coded over
# 256 values, the likeliest and OTHER_VALUES others. (model.config's CHANNELS and LEVELS: not imported,
# since importing imagetx.model imports torch, and the commands read a file before torch.)
RGB = 3
OTHER_VALUES = np.iinfo(np.uint8).max
# The payload's words (constriction's range coder: 32-bit words, a 64-bit state).
WORD_BYTES = 4
WORD_BITS = 8 * WORD_BYTES
# ``payload_bits``'s slack, in words: honest files stay two words under it; float sums of -log2 over
# 300 million values (100,000 images) are off by far less than a bit.
PAST_END_SLACK = 2
# A file's CRC is computed over this many bytes at a time: memory for a piece, not for the file.
CRC_PIECE = 1 << 20


class CodecError(UserError):
    """A file that cannot be decoded (or images that cannot be coded): the message says why."""


@dataclass(frozen=True)
class Header:
    version: int
    precision: int
    threads: int
    head: str
    count: int
    height: int
    width: int
    batch: int
    fingerprint: bytes
    digest: bytes
    arithmetic: Arithmetic | None  # None: a file of format 1 or 2, which does not record it
    # each image's name (a file's stem, "" for none), or () where the file keeps none (formats 1 to 4,
    # or images compressed without names); checked as a file's text, not as safe names (names.py)
    names: tuple[str, ...] = ()


def model_fingerprint(model: ImageTransformer) -> bytes:
    """SHA-256 of the model's config (its fields in the one-level form files have always been
    fingerprinted in, ``io.older.one_level``, as sorted JSON) and of every tensor of its state in
    the form it has always been fingerprinted in (``io.older.older_state``: name, dtype, shape and
    bytes, in name order), first ``FINGERPRINT_BYTES`` bytes."""
    import torch

    from ..io.older import older_state, one_level

    sha = hashlib.sha256()
    sha.update(json.dumps(one_level(model.config), sort_keys=True, default=str).encode())
    for name, tensor in sorted(older_state(model).items()):
        tensor = tensor.detach().cpu().contiguous()
        sha.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        sha.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return sha.digest()[:FINGERPRINT_BYTES]


def pixel_digest(images: np.ndarray) -> bytes:
    """First ``DIGEST_BYTES`` bytes of the SHA-256 of (N, H, W, 3) uint8 pixels, C order."""
    return hashlib.sha256(np.ascontiguousarray(images, dtype=np.uint8).tobytes()).digest()[:DIGEST_BYTES]


def pack(header: Header, payload: bytes) -> bytes:
    """The whole file: header, payload, CRC-32."""
    head = HEADER.pack(MAGIC, header.version, header.precision, header.threads, HEADS.index(header.head),
                       header.count, header.height, header.width, header.batch, header.fingerprint,
                       header.digest, len(payload))
    if header.version >= ARITHMETIC_VERSION:
        arithmetic = header.arithmetic
        head += ARITHMETIC.pack(arithmetic.portable, arithmetic.machine.encode(), arithmetic.kernels.encode(),
                                arithmetic.torch.encode())
    if header.version >= NAMES_VERSION:
        names = names_block(header.names, header.version) if any(header.names) else b""
        head += NAMES_LENGTH.pack(len(names)) + names
    body = head + payload
    return body + TRAILER.pack(zlib.crc32(body))


def header_size(version: int, names_bytes: int = 0) -> int:
    """The bytes before the payload in a file of format ``version`` whose names take ``names_bytes``."""
    size = HEADER.size + (ARITHMETIC.size if version >= ARITHMETIC_VERSION else 0)
    return size + (NAMES_LENGTH.size + names_bytes if version >= NAMES_VERSION else 0)


def unpack(data: bytes) -> tuple[Header, bytes]:
    """A file's bytes -> (its header, its payload), or a ``CodecError`` saying what is wrong."""
    handle = io.BytesIO(data)
    header, start, length = parse(functools.partial(read_at, handle), len(handle.getbuffer()))
    return header, read_at(handle, start, length)


@dataclass(frozen=True)
class Checked:
    """A compressed file, its header and CRC checked, its payload read when asked: from a file on
    disk (``read_file``) only then, so that a refusal before the decoding costs its header, never
    its size in memory."""

    header: Header
    payload: Callable[[], bytes]


def checked(data: bytes | Checked) -> Checked:
    """A file's bytes (``unpack``), or a file already checked, as ``Checked``."""
    if isinstance(data, Checked):
        return data
    header, payload = unpack(data)
    return Checked(header, lambda: payload)


def read_file(path: str | os.PathLike) -> Checked:
    """A compressed file on disk, checked as ``unpack`` checks its bytes, its CRC computed piece by
    piece; a ``CodecError`` saying what is wrong."""
    path = Path(path)
    with path.open("rb") as handle:
        header, start, length = parse(functools.partial(read_at, handle), os.fstat(handle.fileno()).st_size)

    def payload() -> bytes:
        with path.open("rb") as handle:
            words = read_at(handle, start, length)
        if len(words) != length:
            raise CodecError("the file changed while it was read (it is shorter now)")
        return words

    return Checked(header, payload)


def read_at(handle: BinaryIO, at: int, count: int) -> bytes:
    handle.seek(at)
    return handle.read(count)


def parse(read: Callable[[int, int], bytes], size: int) -> tuple[Header, int, int]:
    """A file of ``size`` bytes, whose bytes ``read(offset, count)`` gives -> (its header, where
    its payload starts, the payload's length), or a ``CodecError`` saying what is wrong. Read in
    pieces: the fixed fields, the CRC over CRC_PIECE at a time, then the names."""
    fixed = read(0, min(size, header_size(READ_VERSIONS[-1])))
    if len(fixed) < len(MAGIC) or fixed[:len(MAGIC)] != MAGIC:
        raise CodecError("not an imagetx compressed file (it does not start with ITXC)")
    if size < HEADER.size + TRAILER.size:
        raise CodecError(f"the file is truncated: {size} bytes, shorter than the "
                         f"{HEADER.size + TRAILER.size}-byte header and checksum")
    (_, version, precision, threads, head, count, height, width, batch, fingerprint, digest,
     length) = HEADER.unpack_from(fixed)
    if version not in READ_VERSIONS:
        raise CodecError(f"the file is in format version {version}; this imagetx reads versions "
                         f"{', '.join(map(str, READ_VERSIONS))}")
    names_bytes = 0
    if version >= NAMES_VERSION:
        at = header_size(version) - NAMES_LENGTH.size
        if size < at + NAMES_LENGTH.size + TRAILER.size:
            raise CodecError(f"the file is truncated: {size} bytes, shorter than its header and checksum")
        (names_bytes,) = NAMES_LENGTH.unpack_from(fixed, at)
    start = header_size(version, names_bytes)
    expected = start + length + TRAILER.size
    if size != expected:
        state = "truncated" if size < expected else "longer than its header says"
        raise CodecError(f"the file is {state}: {size} bytes, its header says {expected}")
    crc = 0
    for at in range(0, size - TRAILER.size, CRC_PIECE):
        crc = zlib.crc32(read(at, min(CRC_PIECE, size - TRAILER.size - at)), crc)
    if TRAILER.unpack(read(size - TRAILER.size, TRAILER.size))[0] != crc:
        raise CodecError("the file is damaged: its CRC-32 does not match its contents")
    # The CRC holds, so these are what the writer wrote; still checked, against a crafted file.
    if head >= len(HEADS) or not 1 <= count <= MAX_IMAGES or not 1 <= batch <= MAX_BATCH \
            or not 1 <= threads <= MAX_THREADS or not height or not width or length % 4:
        raise CodecError("the file's header is invalid (head, image count, batch, threads or payload length "
                         "out of range)")
    symbols = count * height * width * RGB
    if least_bits(symbols, precision) > payload_bits(length // WORD_BYTES):
        raise CodecError(f"the file's header is invalid ({count:,} images of {width}x{height} cannot be coded in "
                         f"{length:,} payload bytes)")
    arithmetic = read_arithmetic(fixed) if version >= ARITHMETIC_VERSION else None
    names = read_names(read(start - names_bytes, names_bytes), count, version) if names_bytes else ()
    header = Header(version, precision, threads, HEADS[head], count, height, width, batch, fingerprint, digest,
                    arithmetic, names)
    return header, start, length


def least_bits(symbols: int, precision: int) -> float:
    """The fewest bits ``symbols`` sub-pixels can be coded in with ``precision``-bit frequencies:
    every one of a sub-pixel's 256 values keeps a frequency of at least 1 (distributions.MIN_FREQUENCY;
    format 1's re-quantisation too), so the likeliest has at most 2**precision - OTHER_VALUES and
    costs at least -log2(1 - OTHER_VALUES / 2**precision) bits (2.2e-5 at 24 bits: 0.07 bits a
    32x32 image; 844 bytes for 100,000 of them). 0 for a precision too small to say (refused
    later: the codec's is 24)."""
    if 2 ** precision <= OTHER_VALUES + 1:
        return 0.0
    return -symbols * math.log2(1 - OTHER_VALUES / 2 ** precision)


def payload_bits(words: int) -> float:
    """The most information (the sum of -log2(frequency / 2**precision) over the values decoded)
    a payload of ``words`` 32-bit words can hold, by the range coder's arithmetic: decoding that
    much reads at least 1 + bits / 32 words (its 64-bit state narrows by the values' probabilities,
    or more where it rounds, and holds at least 2**32 after each refill), and the decoder of an
    honest payload reads at most one word past its end (the encoder leaves out a last word of zeros;
    constriction 0.5). What claims more (a header's image count, a decoding under way) would
    read past the payload's end; PAST_END_SLACK words more cover the rounding of float sums."""
    return WORD_BITS * (words + PAST_END_SLACK)


def read_arithmetic(data: bytes) -> Arithmetic:
    from .arithmetic import Arithmetic

    portable, machine, kernels, version = ARITHMETIC.unpack_from(data, HEADER.size)
    texts = [field.rstrip(b"\0").decode("ascii", errors="replace") for field in (machine, kernels, version)]
    if portable > 1 or not all(text and text.isascii() and text.isprintable() for text in texts):
        raise CodecError("the file's header is invalid (its arithmetic is not one imagetx writes)")
    return Arithmetic(bool(portable), *texts)


def names_block(names: tuple[str, ...], version: int) -> bytes:
    """The names list as a file of format ``version`` stores it: packed, or NUL-separated UTF-8 (5)."""
    if version >= PACKED_NAMES_VERSION:
        return names_list.pack(names)
    return NAME_SEPARATOR.join(name.encode() for name in names)


def read_names(block: bytes, count: int, version: int) -> tuple[str, ...]:
    """A file's names list (``count`` names: packed, or NUL-separated UTF-8 in format 5) -> the
    names, or a CodecError."""
    if version >= PACKED_NAMES_VERSION:
        try:
            return names_list.unpack(block, count)
        except names_list.NamesListError as error:
            raise CodecError(f"the file's names list is invalid ({error})") from None
    if len(block) > count * (MAX_NAME_BYTES + len(NAME_SEPARATOR)):
        raise CodecError(f"the file's names list is invalid ({len(block):,} bytes for {count:,} images: "
                         f"more than {MAX_NAME_BYTES} bytes a name)")
    try:
        names = block.decode("utf-8").split(NAME_SEPARATOR.decode())
    except UnicodeDecodeError:
        raise CodecError("the file's names list is invalid (not UTF-8 text)") from None
    if len(names) != count:
        raise CodecError(f"the file's names list is invalid ({len(names):,} names for {count:,} images)")
    return tuple(names)
