"""imagetx: the Image Transformer (Parmar et al., 2018) in PyTorch + Lightning.

The public API::

    from imagetx import ModelConfig, ImageTransformer, load_model, save_model
    model = ImageTransformer(ModelConfig(n_layers=2, d_model=64, n_heads=2, d_filter=128))
    nats = model.nll(images)            # uint8 (B, 32, 32, 3) -> (B,) nats per image
    bpd = model.bits_per_dim(images)    # (B,) bits per sub-pixel
"""

from .checkpoint import CheckpointError, load_model, save_model
from .config import ModelConfig
from .model import ImageTransformer

__all__ = ["CheckpointError", "ImageTransformer", "ModelConfig", "load_model", "save_model"]
__version__ = "0.1.0"
