"""The Trainer that ``imagetx.train`` runs: Lightning's, with the batch limits typed for the parser."""

from __future__ import annotations

import lightning as L


class Trainer(L.Trainer):
    """Lightning's Trainer, with the batch limits typed ``int | float`` so that a YAML ``1``
    stays the count 1. Lightning's own annotation reaches the parser as ``float | int``
    (typing caches a Union by its members, whatever their order), which turns 1 into 1.0:
    every batch.

    Args:
        limit_train_batches: training batches per epoch: an int counts, a float is a fraction
        limit_val_batches: validation batches per validation: an int counts, a float is a fraction
        limit_test_batches: test batches: an int counts, a float is a fraction
        limit_predict_batches: prediction batches: an int counts, a float is a fraction
    """

    def __init__(self, *args, limit_train_batches: int | float | None = None,
                 limit_val_batches: int | float | None = None, limit_test_batches: int | float | None = None,
                 limit_predict_batches: int | float | None = None, **kwargs) -> None:
        super().__init__(*args, limit_train_batches=limit_train_batches, limit_val_batches=limit_val_batches,
                         limit_test_batches=limit_test_batches, limit_predict_batches=limit_predict_batches, **kwargs)
