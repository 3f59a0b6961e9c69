"""imagetx: the Image Transformer (Parmar et al., 2018) in PyTorch + Lightning.

The public API (the network, ``imagetx.model``, and its files, ``imagetx.io``: torch, einops,
safetensors and huggingface_hub; importing it, loading, scoring and sampling never import
Lightning)::

    from imagetx import AttentionConfig, ModelConfig, ImageTransformer, from_pretrained, load_model, save_pretrained
    model = ImageTransformer(ModelConfig(n_layers=2, d_model=64, d_filter=128, attention=AttentionConfig(n_heads=2)))
    # build_model(config) builds either: the decoder, or with a superres section the super-resolution model
    nats = model.nll(images)            # uint8 (B, 32, 32, 3) -> (B,) nats per image
    bpd = model.bits_per_dim(images)    # (B,) bits per sub-pixel
    save_pretrained(model, "my-model")  # my-model/model.safetensors + config.json + README.md
    model = from_pretrained("my-model")  # or a Hugging Face Hub repository id
    model = load_model("runs/quick/checkpoints/last.ckpt")  # a training checkpoint, or a folder
"""

from .io.lazy import lazy_names

# Where each public name lives: imported on first use (io/lazy.py), not with the package.
PUBLIC = {"CheckpointError": ".io.errors", "from_pretrained": ".io.hub", "push_to_hub": ".io.hub",
          "save_pretrained": ".io.hub", "load_model": ".io.load", "AttentionConfig": ".model",
          "ImageTransformer": ".model", "ModelConfig": ".model", "SuperResolutionConfig": ".model",
          "SuperResolutionTransformer": ".model", "build_model": ".model"}

__all__ = sorted(PUBLIC)
__version__ = "0.1.0"
__getattr__, __dir__ = lazy_names(__name__, PUBLIC)
