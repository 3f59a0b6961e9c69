"""The network: its attention patterns and heads, likelihoods, sampling and FLOP counts. A leaf
of the package: it imports torch and einops (and tqdm for progress bars), nothing else of
imagetx; loading, saving and sharing a model are ``imagetx.io``'s."""

from .config import ModelConfig
from .superres import SuperResolutionTransformer, build_model
from .transformer import ImageTransformer

__all__ = ["ImageTransformer", "ModelConfig", "SuperResolutionTransformer", "build_model"]
