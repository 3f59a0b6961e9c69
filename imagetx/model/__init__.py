"""The network: its attention patterns and heads, likelihoods, sampling and FLOP counts. A leaf
of the package: it imports torch and einops (and tqdm for progress bars), and of imagetx only
two leaves, ``imagetx.errors`` (``UserError``) and ``imagetx.compat`` (other libraries' private
API); loading, saving and sharing a model are ``imagetx.io``'s."""

from .config import AttentionConfig, ModelConfig, SuperResolutionConfig
from .superres import SuperResolutionTransformer, build_model
from .transformer import ImageTransformer

__all__ = ["AttentionConfig", "ImageTransformer", "ModelConfig", "SuperResolutionConfig", "SuperResolutionTransformer",
           "build_model"]
