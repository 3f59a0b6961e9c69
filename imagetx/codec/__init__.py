"""Lossless image compression with a model (docs/compress.md): ``compress`` images into one
file's bytes, ``decompress`` them back exactly. ``python -m imagetx.compress`` and
``python -m imagetx.decompress`` are the commands."""

from ..io.lazy import lazy_names

# Where each public name lives: imported on first use (io/lazy.py), so that the commands' light modules
# (files.py, container.py) are read without the coder and torch.
PUBLIC = {"CompressionStats": ".api", "compress": ".api", "compress_with_stats": ".api", "decompress": ".api",
          "read_header": ".api", "CodecError": ".container", "Header": ".container",
          "model_fingerprint": ".container"}

__all__ = sorted(PUBLIC)
__getattr__, __dir__ = lazy_names(__name__, PUBLIC)
