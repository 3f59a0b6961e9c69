"""imagetx: the Image Transformer (Parmar et al., 2018) in PyTorch + Lightning.

The public API::

    from imagetx import ModelConfig, ImageTransformer, load_model, save_pretrained
    model = ImageTransformer(ModelConfig(n_layers=2, d_model=64, n_heads=2, d_filter=128))
    nats = model.nll(images)            # uint8 (B, 32, 32, 3) -> (B,) nats per image
    bpd = model.bits_per_dim(images)    # (B,) bits per sub-pixel
    save_pretrained(model, "my-model")  # my-model/model.safetensors + config.json
    model = load_model("my-model")      # or a training checkpoint (.ckpt)
"""

from .io.checkpoint import CheckpointError
from .model.config import ModelConfig
from .model.transformer import ImageTransformer
from .io.weights import from_pretrained, load_model, save_pretrained

__all__ = ["CheckpointError", "ImageTransformer", "ModelConfig", "from_pretrained", "load_model", "save_pretrained"]
__version__ = "0.1.0"
