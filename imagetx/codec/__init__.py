"""Lossless image compression with a model (docs/compress.md): ``compress`` images into one
file's bytes, ``decompress`` them back exactly. ``python -m imagetx.compress`` and
``python -m imagetx.decompress`` are the commands."""

from .api import CompressionStats, compress, compress_with_stats, decompress, read_header
from .container import CodecError, Header, model_fingerprint

__all__ = ["CodecError", "CompressionStats", "Header", "compress", "compress_with_stats", "decompress",
           "model_fingerprint", "read_header"]
