"""The model core: the network, its attention patterns and heads, likelihoods, sampling and FLOP
counts. It needs torch and einops only; nothing here imports the training stack
(``imagetx.training``), the data pipeline or the command lines."""

from .config import ModelConfig
from .transformer import ImageTransformer

__all__ = ["ImageTransformer", "ModelConfig"]
