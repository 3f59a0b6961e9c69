"""Sharing as the Hugging Face Hub does: ``ImageTransformer.save_pretrained``, ``from_pretrained``
and ``push_to_hub``, through huggingface_hub's ``PyTorchModelHubMixin``, in imagetx's own folder
format (``io/weights.py``: ``model.safetensors`` + ``config.json``, read as data only and checked
against the configuration).

``from_pretrained`` takes a local folder, read as it is (nothing is downloaded), or a Hub
repository id, whose two files huggingface_hub downloads into its cache first. ``save_pretrained``
also writes a model card (README.md) with the Hub's metadata, unless the folder has one.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from huggingface_hub import PyTorchModelHubMixin, snapshot_download

from ..io.errors import CheckpointError
from ..io.weights import CONFIG_FILE, WEIGHTS_FILE, check_tensors, read_weights, write_weights

# The model card save_pretrained writes (jinja2, filled in by huggingface_hub).
MODEL_CARD = """---
{{ card_data }}
---

An Image Transformer (Parmar et al., 2018) saved by imagetx:
`model.safetensors` (the weights) and `config.json` (its `ModelConfig`).

```python
from imagetx import ImageTransformer
model = ImageTransformer.from_pretrained("THIS_FOLDER_OR_REPO")
```
"""

# The Hub's metadata of every card (class keywords of PyTorchModelHubMixin).
HUB_METADATA = dict(library_name="imagetx", license="mit", pipeline_tag="unconditional-image-generation",
                    tags=["image-transformer", "autoregressive", "pixel-model"], model_card_template=MODEL_CARD)


class HubMixin(PyTorchModelHubMixin):
    """PyTorchModelHubMixin in the imagetx folder format, for a model built as ``cls(config)``
    with a ``config`` (``ModelConfig``) attribute."""

    def _save_pretrained(self, save_directory: Path) -> None:
        write_weights(save_directory, self.state_dict(), self.config)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *,
                        map_location: str | torch.device = "cpu", **hub_options):
        """The model in a local folder (``save_pretrained``, ``imagetx.export``), or in a Hub
        repository (``push_to_hub``; ``hub_options``: huggingface_hub's ``revision``, ``token``,
        ``cache_dir``, ``force_download``, ``local_files_only``), in eval mode on ``map_location``,
        in float32 whatever precision the folder stores. Any failure is one CheckpointError."""
        if Path(pretrained_model_name_or_path).is_dir():
            return cls.from_folder(pretrained_model_name_or_path, map_location)
        try:
            return super().from_pretrained(pretrained_model_name_or_path, map_location=map_location, **hub_options)
        except CheckpointError:
            raise
        except Exception as error:  # huggingface_hub's: no network, no such repository, a bad id, ...
            raise CheckpointError(f"{pretrained_model_name_or_path} is not a local folder, and fetching it from the "
                                  f"Hugging Face Hub failed ({type(error).__name__}: {str(error).splitlines()[0]}); "
                                  "pass a folder written by save_pretrained or imagetx.export") from error

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision: str | None, cache_dir, force_download: bool,
                         local_files_only: bool, token, map_location: str | torch.device = "cpu", **config):
        """The mixin's hook for a Hub repository: its two files downloaded, then read as a folder."""
        folder = snapshot_download(model_id, revision=revision, cache_dir=cache_dir, force_download=force_download,
                                   local_files_only=local_files_only, token=token,
                                   allow_patterns=[WEIGHTS_FILE, CONFIG_FILE])
        return cls.from_folder(folder, map_location)

    @classmethod
    def from_folder(cls, directory: str | os.PathLike, map_location: str | torch.device = "cpu"):
        """The model in a local weights folder, checked: the configuration, then every tensor
        against the model it describes."""
        config, stored = read_weights(directory)
        model = cls(config)
        check_tensors(Path(directory) / WEIGHTS_FILE, stored, model.state_dict(),
                      "export the folder again from the checkpoint these weights came from")
        model.load_state_dict(stored)
        return model.to(map_location).eval()
