"""Compressed files crafted to cost time or memory (issue 124, item 7): a header may not claim more
images than its payload can code, a decoding is refused as soon as it reads past the payload's
end, and a file is read in pieces, its payload only when it is decoded."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest
import torch

from helpers import one_error_line, random_images, tiny_model
from imagetx import decompress as decompress_cli
from imagetx.codec import CodecError, compress, decompress, read_header
from imagetx.codec.coder import FAMILY, LEAK, PayloadDecoder
from imagetx.codec.container import CRC_PIECE, PAST_END_SLACK, WORD_BITS, pack, unpack
from imagetx.codec.distributions import TOTAL, quantise
from imagetx.codec.files import read_compressed
from imagetx.io.hub import save_pretrained
from imagetx.model.config import LEVELS

import constriction


@pytest.fixture(scope="module")
def coded():
    """A tiny model and a file of its four 4x4 images: (model, the file's bytes, the images)."""
    model = tiny_model(seed=1, head="dmol")
    images = random_images(4, 4, seed=3).numpy()
    return model, compress(model, images, portable=False), images


def test_a_header_claiming_more_images_than_its_payload_can_code_is_refused(coded):
    """The issue: 119 bytes claiming 100,000 images with an empty payload decoded for 18.5 hours.
    Each sub-pixel costs at least -log2(1 - 255 / 2**24) bits, so 100,000 images of 4x4 need more
    than an empty payload holds (container.least_bits): refused before anything is decoded."""
    model, data, _ = coded
    header, _ = unpack(data)
    bomb = pack(dataclasses.replace(header, count=100_000, batch=1024), b"")
    with pytest.raises(CodecError, match=r"100,000 images of 4x4 cannot be coded in 0 payload bytes"):
        read_header(bomb)
    assert read_header(pack(dataclasses.replace(header, count=4), b"")).count == 4  # a few could be: the decoder's


def counting_steps(model, monkeypatch) -> list[int]:
    steps = []
    real = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda *args: steps.append(1) or real(*args))
    return steps


def test_a_decoding_that_reads_past_the_payload_is_refused_there(coded, monkeypatch):
    """A header claiming 1,000 images over the payload of 4, in passes of 4: refused in the second
    pass, as soon as the values decoded carry more than the payload holds, where the whole decoding
    of 250 passes ran before, to fail on the pixels' checksum."""
    model, data, _ = coded
    header, payload = unpack(data)
    crafted = pack(dataclasses.replace(header, count=1000, batch=4), payload)
    steps = counting_steps(model, monkeypatch)
    with pytest.raises(CodecError, match=f"read past the end of the {len(payload):,}-byte payload"):
        decompress(model, crafted)
    assert len(steps) <= 2 * model.order.length


def frequencies(rng: np.random.Generator, rows: int, sharpness: float) -> torch.Tensor:
    logits = rng.normal(size=(rows, LEVELS)) * sharpness
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    return quantise(torch.from_numpy(probs / probs.sum(axis=1, keepdims=True)))


@pytest.mark.parametrize("sharpness", [0.0, 1.0, 30.0, 1000.0])  # uniform to nearly certain values
def test_honest_payloads_decode_whole_and_reading_past_them_is_refused(sharpness):
    """The bound the decoder enforces (container.payload_bits), against constriction itself: messages
    of every length and skew decode whole, and decoding on past their end is refused within the
    bound (values of frequency 1 in 2**8: each carries 8 bits)."""
    rng = np.random.default_rng(int(sharpness))
    for length in (1, 2, 3, 10, 100, 1000):
        freq = frequencies(rng, length, sharpness)
        symbols = np.array([rng.choice(LEVELS, p=row / TOTAL) for row in freq.numpy()], dtype=np.int32)
        encoder = constriction.stream.queue.RangeEncoder()
        encoder.encode(symbols, FAMILY, (freq - LEAK).numpy().astype(np.float64))
        words = encoder.get_compressed()
        decoder = PayloadDecoder(words)
        assert np.array_equal(decoder.decode(freq, version=5).numpy(), symbols)
        uniform = torch.full((1, LEVELS), TOTAL // LEVELS, dtype=torch.int64)  # 8 bits a value
        with pytest.raises(CodecError, match="read past the end"):
            for _ in range(WORD_BITS * (len(words) + PAST_END_SLACK) // 8 + 1):
                decoder.decode(uniform, version=5)


def test_a_file_is_read_in_pieces_and_its_payload_only_to_decode_it(coded, tmp_path, capsys):
    """The issue: a 900 MB file with a valid CRC peaked at 5.35 GB before its refusal. Reading one
    (header, CRC) takes memory for a piece at a time; a file for another model is refused before its
    payload is read."""
    model, data, _ = coded
    header, payload = unpack(data)
    large = tmp_path / "large.itx"
    large.write_bytes(pack(header, payload + bytes(16 * CRC_PIECE)))  # valid CRC: it is read whole
    tracemalloc.start()
    try:
        checked = read_compressed(str(large))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert checked.header == header and peak < 4 * CRC_PIECE, peak
    assert len(checked.payload()) == len(payload) + 16 * CRC_PIECE
    other = tmp_path / "other"
    save_pretrained(tiny_model(seed=2, head="dmol"), other)
    line = one_error_line(capsys, decompress_cli.main, [str(large), "--ckpt", str(other), "--out",
                                                        str(tmp_path / "out.npz"), "--progress", "false"])
    assert "another model" in line and "large.itx" in line, line
