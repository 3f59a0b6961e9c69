"""Run an imagetx command with every model built with more decoder self-attention heads than its
configuration's, of the configuration's head size (``imagetx.training.grow.widen_attention``):

    .venv/bin/python -m experiments.road_wide_attention HEADS imagetx.train ARGS...
    .venv/bin/python -m experiments.road_wide_attention HEADS imagetx.evaluate ARGS...

What the road study's wide arms train and score (docs/experiments.md entry 35): T2T's attention width
of twice d_model (16 heads of 32 at d 256; 8 heads of 32 at the proxy's d 128), which ``ModelConfig``
cannot describe (its heads are d_model / n_heads wide). The model files stay as they are: the class's
constructor is wrapped here, in this process only, so the same checkpoints load, train and score.
"""

from __future__ import annotations

import runpy
import sys

from imagetx.model.transformer import ImageTransformer
from imagetx.training.grow import widen_attention


def install(heads: int) -> None:
    """Every ImageTransformer (and subclass) built in this process from now on has ``heads`` heads."""
    built = ImageTransformer.__init__

    def init(self, config) -> None:
        built(self, config)
        widen_attention(self, heads)

    ImageTransformer.__init__ = init


def main() -> None:
    if len(sys.argv) < 3 or not sys.argv[1].isdigit():
        sys.exit("usage: python -m experiments.road_wide_attention HEADS MODULE [ARGS...]")
    install(int(sys.argv[1]))
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
