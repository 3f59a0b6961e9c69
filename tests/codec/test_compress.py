"""The codec (imagetx.codec, docs/compress.md): exact round trips with both heads and odd
content, the quantised distributions, and every kind of bad file refused with a CodecError."""

from __future__ import annotations

import dataclasses
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import ASSETS, random_images, tiny_config, tiny_model
from imagetx.codec import CodecError, compress, compress_with_stats, decompress, model_fingerprint, read_header
import imagetx.codec.api as codec_api
from imagetx.codec.arithmetic import PORTABLE_COMMAND, Arithmetic, current
from imagetx.codec.container import (ARITHMETIC, FORMAT_VERSION, HEADER, MAX_IMAGES, NAMES_LENGTH, TRAILER, pack,
                                     unpack)
from imagetx.codec.distributions import PRECISION, TOTAL, PixelDistributions, categorical_probs, quantise
from imagetx import build_model
from imagetx.io.load import load_model

SHIPPED = Path(__file__).resolve().parents[2] / "pretrained" / "completion"


def odd_images(size: int, seed: int = 0) -> np.ndarray:
    """Flat, saturated, noise, a gradient, a checkerboard, edge values only: (6, size, size, 3)."""
    rng = np.random.default_rng(seed)
    flat = np.full((size, size, 3), 77, np.uint8)
    saturated = np.zeros((size, size, 3), np.uint8)
    saturated[..., 0] = 255
    saturated[size // 2:] = 255
    noise = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    ramp = np.linspace(0, 255, size * size * 3).round().astype(np.uint8).reshape(size, size, 3)
    checker = ((np.indices((size, size)).sum(0) % 2) * 255).astype(np.uint8)[..., None].repeat(3, -1)
    edges = rng.choice(np.array([0, 1, 254, 255], np.uint8), (size, size, 3))
    return np.stack([flat, saturated, noise, ramp, checker, edges])


def fix_crc(data: bytes) -> bytes:
    """A crafted file: ``data`` with its CRC recomputed, so that only the later checks stand."""
    body = data[:-TRAILER.size]
    return body + TRAILER.pack(zlib.crc32(body))


@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d"])
def test_round_trip_is_exact_for_odd_content(head, attention):
    model = tiny_model(seed=3, head=head, attention=attention, n_layers=2)  # randomly initialised
    images = np.concatenate([odd_images(4), random_images(5, 4, seed=1).numpy()])
    data = compress(model, images, batch=4, portable=False)  # passes of 4, 4 and 3 images
    out = decompress(model, data)
    assert out.dtype == np.uint8 and out.shape == images.shape
    assert np.array_equal(out, images)
    header = read_header(data)
    assert (header.count, header.batch, header.threads, header.head) == (11, 4, 1, head)


@pytest.mark.parametrize("head", ["categorical", "dmol"])
def test_file_costs_the_models_bits(head):
    """The ideal cost of the quantised distributions is the model's NLL (to 1e-3 bits per
    image), and the file is that plus the header and a few bytes of the coder."""
    model = tiny_model(seed=1, head=head)
    images = random_images(6, 4, seed=2)
    data, stats = compress_with_stats(model, images.numpy(), batch=6, portable=False)
    with torch.no_grad():
        model_bits = float(model.nll(images).sum()) / math.log(2)
    assert stats.ideal_bits == pytest.approx(model_bits, abs=6e-3)
    overhead = len(data) - stats.ideal_bits / 8
    framing = HEADER.size + ARITHMETIC.size + NAMES_LENGTH.size + TRAILER.size  # no names: an empty list
    assert framing <= overhead <= framing + 8


# The range coder's last words: what a file's payload may hold beyond its symbols' cost.
CODER_FLUSH_BITS = 64


def spiked_model():
    """A categorical model that gives value 0 almost all the mass at every step: every other
    value gets the least frequency, 1 of 2**24, so it costs exactly 24 bits."""
    model = tiny_model(seed=4)
    with torch.no_grad():
        model.head.proj.bias[0] = 1e3
    return model


def test_a_value_costs_exactly_what_its_frequency_says():
    """Issue 74: constriction must code with the quantised integers themselves, not re-quantise
    them (format 1 did: a value of frequency 1 cost 23 bits). ``ideal_bits`` is then what the
    file's payload costs, less the coder's last words."""
    model = spiked_model()
    images = random_images(3, 4, seed=5).numpy() | 1  # no value 0: every sub-pixel at frequency 1
    data, stats = compress_with_stats(model, images, portable=False)
    assert stats.ideal_bits == pytest.approx(PRECISION * stats.dims)
    payload_bits = 8 * len(unpack(data)[1])
    assert 0 <= payload_bits - stats.ideal_bits <= CODER_FLUSH_BITS
    assert np.array_equal(decompress(model, data), images)


def test_format_1_files_are_decoded_as_they_were_coded(monkeypatch):
    """Files of format 1 (the frequencies re-quantised by constriction) still decode exactly;
    compress writes format 2, which spends the 24 bits format 1 did not."""
    model = spiked_model()
    images = random_images(3, 4, seed=5).numpy() | 1
    current = compress(model, images, portable=False)
    monkeypatch.setattr(codec_api, "FORMAT_VERSION", 1)  # as compress wrote before issue 74
    old = compress(model, images, portable=False)
    assert (old[4], current[4]) == (1, FORMAT_VERSION) == (1, 7)
    assert np.array_equal(decompress(model, old), images)
    assert len(old) < len(current)  # format 1 coded these values at 23 bits


def test_a_file_compressed_before_the_config_had_sections_names_the_same_model():
    """tests/assets/completion_val_first2.itx: the first two val images of tests/data, compressed with
    the shipped completion model by commit bf0de5f, whose config was one level. The fingerprint
    hashes that form (imagetx.io.older.one_level), so the file names today's model. (It was coded
    with native kernels, so it decodes only where they compute as that machine's did: the
    portable file's test, tests/codec/test_codec_portable.py, decodes on every machine.)"""
    model = load_model(SHIPPED)
    header = read_header((ASSETS / "completion_val_first2.itx").read_bytes())
    assert (header.version, header.arithmetic) == (2, None)
    assert header.fingerprint == model_fingerprint(model)
    # the control: the same model under a config one field away is another model
    other = build_model(dataclasses.replace(model.config, dropout=0.5))
    other.load_state_dict(model.state_dict())
    assert header.fingerprint != model_fingerprint(other)


def test_shipped_dmol_model_round_trip_and_size():
    """The shipped DMOL model: CIFAR-like content and odd content, one file, exact; the file
    within 1% (+ 60 bytes) of the model's own bits. The coder may spend less than the model: a
    value the model gives almost no mass (noise, edge values) costs it at most 24 bits."""
    model = load_model(SHIPPED)
    rng = np.random.default_rng(0)
    smooth = np.cumsum(rng.integers(0, 3, (2, 32, 32, 3)), axis=2).clip(0, 255).astype(np.uint8)
    images = np.concatenate([odd_images(32)[[0, 1, 2, 5]], smooth])
    data, stats = compress_with_stats(model, images, batch=6, portable=False)
    assert np.array_equal(decompress(model, data), images)
    with torch.no_grad():
        model_bits = float(model.nll(torch.from_numpy(images)).sum()) / math.log(2)
    assert stats.ideal_bits <= model_bits * (1 + 1e-4)
    assert len(data) * 8 <= model_bits * 1.01 + 60 * 8


def test_a_file_records_its_arithmetic_and_portable_coding_needs_it(monkeypatch):
    """The header says how the file was coded (arithmetic.current()); compress asks for portable
    arithmetic unless told portable=False, in one line that names the settings."""
    model = tiny_model(seed=1, head="dmol")
    images = random_images(2, 4, seed=2).numpy()
    data = compress(model, images, portable=False)
    assert read_header(data).arithmetic == current()
    monkeypatch.delenv("MKL_CBWR", raising=False)  # whatever this process's kernels: not portable now
    assert not current().portable
    with pytest.raises(CodecError, match=f"start Python with {PORTABLE_COMMAND}.*portable=False") as refused:
        compress(model, images)
    assert "\n" not in str(refused.value)


def test_format_2_files_still_decode(monkeypatch):
    """Format 2 (no arithmetic recorded): the same layout less the arithmetic, decoded as before."""
    model = tiny_model(seed=1, head="categorical")
    images = random_images(2, 4, seed=2).numpy()
    monkeypatch.setattr(codec_api, "FORMAT_VERSION", 3)  # format 2's distributions (coder.py, LIBM_FREE_VERSION)
    current_format = compress(model, images, portable=False)
    monkeypatch.setattr(codec_api, "FORMAT_VERSION", 2)
    data = compress(model, images, portable=False)
    assert data[4] == 2 and read_header(data).arithmetic is None
    assert unpack(data)[1] == unpack(current_format)[1]  # the same payload: format 3 adds the record only
    assert len(current_format) == len(data) + ARITHMETIC.size
    assert np.array_equal(decompress(model, data), images)


def recorded(data: bytes, arithmetic: Arithmetic) -> bytes:
    """A file's bytes with ``arithmetic`` written in its header (the CRC recomputed)."""
    header, payload = unpack(data)
    return pack(dataclasses.replace(header, arithmetic=arithmetic), payload)


def refuse_decoding(*args, **kwargs):
    raise AssertionError("decoded, where the file should have been refused before decoding")


def test_a_file_of_the_other_kind_of_arithmetic_is_refused_before_decoding(coded, monkeypatch):
    """A portable file in a process with native kernels (and the reverse) is refused at once, in
    one line that says how to decode it; so is a native file of other kernels than this process's
    (issue 124: it was refused only after a whole decode). A file whose recorded arithmetic differs
    in another way (a portable file's torch) is decoded, and would be explained if it failed."""
    model, images, data = coded
    here = dataclasses.replace(current(), portable=False, kernels="AVX512")
    native_file = recorded(data, dataclasses.replace(here, kernels="AVX2"))
    portable_file = recorded(data, dataclasses.replace(here, portable=True, kernels="DEFAULT"))
    monkeypatch.setattr(codec_api, "current", lambda: here)
    monkeypatch.setattr(codec_api, "decode_values", refuse_decoding)
    with pytest.raises(CodecError, match=f"coded with portable arithmetic .*start Python with {PORTABLE_COMMAND}"):
        decompress(model, portable_file)
    with pytest.raises(CodecError, match="coded with native AVX2 kernels .*computes with native AVX512 kernels .*"
                                         "decodes only where they are the same") as refused:
        decompress(model, native_file)
    assert "\n" not in str(refused.value)
    with pytest.raises(CodecError, match="native AVX2 kernels \\(aarch64.*decodes only where"):
        decompress(model, recorded(data, dataclasses.replace(here, machine="aarch64", kernels="AVX2")))
    monkeypatch.setattr(codec_api, "current", lambda: dataclasses.replace(here, portable=True, kernels="DEFAULT"))
    with pytest.raises(CodecError, match="coded with native AVX2 kernels .*without those settings"):
        decompress(model, native_file)
    monkeypatch.undo()
    other_torch = dataclasses.replace(current(), torch="0.0.0+other")
    assert np.array_equal(decompress(model, recorded(data, other_torch)), images)  # tried, and it decodes


def test_a_file_that_does_not_decode_names_both_arithmetics(coded, monkeypatch):
    """The decoder's failure (here: a crafted payload word) says what the file was coded with
    against what this process computes with, or that the file was crafted where they agree."""
    model, _, data = coded
    header, payload = unpack(data)
    crafted = bytearray(payload)
    crafted[0] ^= 0xFF
    other = dataclasses.replace(header.arithmetic, torch="0.0.0+other")  # (other kernels: refused before decoding)
    with pytest.raises(CodecError, match="does not decode here .*coded with other arithmetic, native .*torch 0.0.0"):
        decompress(model, pack(dataclasses.replace(header, arithmetic=other), bytes(crafted)))
    with pytest.raises(CodecError, match="does not decode here .*records this process's arithmetic .*crafted"):
        decompress(model, pack(header, bytes(crafted)))
    with pytest.raises(CodecError, match="format 2.*native kernels of the machine that made it"):
        decompress(model, pack(dataclasses.replace(header, version=2, arithmetic=None), bytes(crafted)))


def test_an_arithmetic_field_that_is_not_text_is_refused(coded):
    model, _, data = coded
    for offset, value in ((HEADER.size, 2), (HEADER.size + 1, 0xFF), (HEADER.size + 1, 0)):
        crafted = bytearray(data)
        crafted[offset] = value
        with pytest.raises(CodecError, match="header is invalid"):
            decompress(model, fix_crc(bytes(crafted)))


def test_quantise_keeps_every_value_and_sums_exactly():
    rng = np.random.default_rng(0)
    logits = torch.from_numpy(rng.normal(0, 30, (64, 256)))  # very peaked rows: most values near 0 mass
    logits[0] = 0.0  # uniform
    logits[1, 17] = 1e4  # all mass on one value
    freq = quantise(categorical_probs(logits))
    assert freq.dtype == torch.int64
    assert (freq >= 1).all()
    assert (freq.sum(-1) == TOTAL).all()
    assert (freq[0] == TOTAL // 256).all()
    assert freq[1, 17] == TOTAL - 255
    with pytest.raises(FloatingPointError):
        quantise(torch.full((1, 256), float("nan"), dtype=torch.float64))


def test_dmol_channels_multiply_to_the_heads_likelihood():
    """R, then G given R, then B given R and G: their product over a pixel is the head's
    log_prob of the pixel (edge levels included)."""
    model = tiny_model(seed=5, head="dmol", mixture_components=3)
    params = torch.randn(8, model.head.proj.out_features, dtype=torch.float64) * 3
    pixels = torch.tensor([[0, 0, 0], [255, 255, 255], [0, 255, 128], [17, 200, 3]] * 2)
    dist = PixelDistributions(model.head, params)
    total = torch.zeros(8, dtype=torch.float64)
    for channel in range(3):
        probs = dist.channel(channel)
        assert torch.allclose(probs.sum(-1), torch.ones(8, dtype=torch.float64))
        total += probs.gather(1, pixels[:, channel:channel + 1])[:, 0].log()
        dist.observe(channel, pixels[:, channel])
    expected = model.head.log_prob(params[:, None], pixels[:, None])[:, 0]
    assert torch.allclose(total, expected, atol=1e-9)


def test_another_model_is_refused_by_its_fingerprint():
    model = tiny_model(seed=0, head="dmol")
    data = compress(model, random_images(2, 4).numpy(), portable=False)
    assert read_header(data).batch == 2  # by default every image of a file in one decoding pass
    other = tiny_model(seed=0, head="dmol")
    with torch.no_grad():
        other.head.proj.bias[0] += 1e-6  # one weight, barely changed
    assert model_fingerprint(other) != model_fingerprint(model)
    with pytest.raises(CodecError, match="another model"):
        decompress(other, data)
    same_weights_other_config = tiny_model(seed=0, head="dmol", dropout=0.1)
    with pytest.raises(CodecError, match="another model"):
        decompress(same_weights_other_config, data)
    assert model_fingerprint(tiny_model(seed=0, head="dmol")) == model_fingerprint(model)  # deterministic


@pytest.fixture(scope="module")
def coded():
    model = tiny_model(seed=2, head="dmol")
    images = random_images(3, 4, seed=4).numpy()
    return model, images, compress(model, images, portable=False)


def test_not_a_file_of_ours(coded):
    model, _, data = coded
    for junk in (b"", b"IT", b"PK\x03\x04 a zip, not ours", data[4:]):
        with pytest.raises(CodecError, match="not an imagetx compressed file"):
            decompress(model, junk)


def test_truncated_or_extended_file(coded):
    model, _, data = coded
    for length in (5, HEADER.size - 1, HEADER.size + 3, len(data) - 1):
        with pytest.raises(CodecError, match="truncated"):
            decompress(model, data[:length])
    with pytest.raises(CodecError, match="longer than its header says"):
        decompress(model, data + b"\0")


def test_every_damaged_byte_is_caught(coded):
    model, images, data = coded
    for offset in range(len(data)):
        damaged = bytearray(data)
        damaged[offset] ^= 0x10
        with pytest.raises(CodecError):
            decompress(model, bytes(damaged))


def test_crafted_files_never_decode_to_a_wrong_image(coded):
    """With the CRC recomputed (a crafted file): a changed payload word or pixel digest gives a
    CodecError, never other pixels; absurd header fields are refused before decoding."""
    model, images, data = coded
    header = read_header(data)
    for offset in range(HEADER.size, len(data) - TRAILER.size, 3):
        crafted = bytearray(data)
        crafted[offset] ^= 0x01
        try:
            out = decompress(model, fix_crc(bytes(crafted)))
        except CodecError:
            continue
        assert np.array_equal(out, images)  # a change the range coder never reads back
    digest_at = HEADER.size - 12  # the 8-byte pixel digest, then the 4-byte payload length
    crafted = bytearray(data)
    crafted[digest_at] ^= 0xFF
    with pytest.raises(CodecError, match="do not match its checksum.*records this process's arithmetic"):
        decompress(model, fix_crc(bytes(crafted)))
    count_at = 8
    for count in (0, MAX_IMAGES + 1):
        crafted = bytearray(data)
        struct.pack_into("<I", crafted, count_at, count)
        with pytest.raises(CodecError, match="header is invalid"):
            decompress(model, fix_crc(bytes(crafted)))
    version = bytearray(data)
    version[4] = 9
    with pytest.raises(CodecError, match="format version 9; this imagetx reads versions 1, 2, 3, 4, 5"):
        decompress(model, fix_crc(bytes(version)))
    assert header.count == 3


def test_images_the_codec_cannot_take():
    model = tiny_model(head="dmol")
    with pytest.raises(CodecError, match="resizes nothing|nothing is resized"):
        compress(model, np.zeros((1, 8, 8, 3), np.uint8))
    with pytest.raises(CodecError, match="uint8"):
        compress(model, np.zeros((1, 4, 4, 3), np.float32))
    with pytest.raises(CodecError, match="unconditional"):
        compress(tiny_model(num_classes=10), np.zeros((1, 4, 4, 3), np.uint8))


def test_the_fingerprint_leaves_out_a_transform_input_no_model_has():
    """A file names its model by a hash of its one-level config (io.older.one_level): the field
    num_transforms (issue 127), 0 in every model before it, is left out there, or every committed file
    would name another model; a model that has the input is fingerprinted with it."""
    from imagetx.io.older import one_level

    assert "num_transforms" not in one_level(tiny_config())
    assert one_level(tiny_config(num_transforms=48))["num_transforms"] == 48
