"""Sharing as the Hugging Face Hub does, kept out of the network (as timm's ``_hub.py`` is):
``save_pretrained`` writes a model into imagetx's weights folder (``weights.py``:
``model.safetensors`` + ``config.json``) with a model card, ``from_pretrained`` reads a local
folder or a Hub repository, ``push_to_hub`` uploads the folder::

    from imagetx import from_pretrained, push_to_hub, save_pretrained
    model = from_pretrained("pretrained/completion")   # a folder, or a Hub repository id
    save_pretrained(model, "my-model")                 # my-model/: model.safetensors, config.json, README.md
    push_to_hub(model, "you/my-model")                 # the same folder, to the Hub

A local folder is read as it is (nothing is downloaded); ``pretrained/NAME``, as the README names a
shipped model, is found from any folder (``io.shipped.resolve``, as the commands find it); of a Hub
repository only the two files are downloaded, into huggingface_hub's cache, then read as a folder, with the same checks. A name
meant as a local path that names no folder (``pretrained/typo``) is refused as such, not looked up
on the Hub.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from huggingface_hub import HfApi, ModelCard, ModelCardData, snapshot_download

from .shipped import resolve, shipped_folder
from ..model.transformer import AutoregressiveModel
from .errors import CheckpointError
from .names import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE
from .weights import model_from_folder, write_weights

# The model card save_pretrained writes (jinja2, filled in by huggingface_hub).
MODEL_CARD = """---
{{ card_data }}
---

An Image Transformer (Parmar et al., 2018) saved by imagetx:
`model.safetensors` (the weights) and `config.json` (its `ModelConfig`).

```python
from imagetx import from_pretrained
model = from_pretrained("THIS_FOLDER_OR_REPO")
```
"""

# The Hub's metadata of every card: how the Hub lists and filters the model.
HUB_METADATA = dict(library_name="imagetx", license="mit", pipeline_tag="unconditional-image-generation",
                    tags=["image-transformer", "autoregressive", "pixel-model"])


def model_card(facts: list[str] = (), datasets: list[str] | None = None) -> str:
    """The model card save_pretrained writes: the Hub's metadata (and ``datasets``, the Hub's names
    of the data trained on), the generic text and, given ``facts``, a "Training" section of them
    (imagetx.export: steps, data, val bits/dim)."""
    data = ModelCardData(**HUB_METADATA, **({"datasets": datasets} if datasets else {}))
    text = str(ModelCard.from_template(data, template_str=MODEL_CARD))
    if facts:
        text = text.rstrip("\n") + "\n\n## Training\n\n" + "".join(f"- {fact}\n" for fact in facts)
    return text


def save_pretrained(model: AutoregressiveModel, directory: str | os.PathLike, card: str | None = None) -> Path:
    """Write ``model`` into the weights folder ``directory`` (created if missing): its tensors, its
    configuration and, unless the folder has one, a model card: ``card``, else the generic one
    (``model_card``). Returns the folder."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_weights(directory, model.state_dict(), model.config)
    if not (directory / CARD_FILE).exists():  # a card the user wrote is theirs
        (directory / CARD_FILE).write_text(card if card is not None else model_card(), encoding="utf-8")
    return directory


def from_pretrained(name_or_path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    **hub_options) -> AutoregressiveModel:
    """The model in a local folder (``save_pretrained``, ``imagetx.export``), or in a Hub
    repository (``push_to_hub``; ``hub_options``: huggingface_hub's ``revision``, ``token``,
    ``cache_dir``, ``force_download``, ``local_files_only``), in eval mode on ``map_location``,
    in float32 whatever precision the folder stores. ``pretrained/NAME`` that is not a folder here is
    the shipped model of that name. Any failure is one CheckpointError."""
    folder = resolve(os.fspath(name_or_path))
    if Path(folder).is_dir():
        return model_from_folder(folder, map_location)
    if meant_as_local_path(name_or_path):
        raise CheckpointError(f"{name_or_path}: no such folder (a local path: its first folder exists here, or it "
                              "starts with /, ./, ../ or ~); a Hub repository is named by its id, owner/name")
    try:
        folder = snapshot_download(str(name_or_path), allow_patterns=[WEIGHTS_FILE, CONFIG_FILE], **hub_options)
    except Exception as error:  # huggingface_hub's: no network, no such repository, a bad id, ...
        raise CheckpointError(f"{name_or_path} is not a local folder, and fetching it from the Hugging Face Hub "
                              f"failed ({type(error).__name__}: {str(error).splitlines()[0]}); pass a folder "
                              "written by save_pretrained or imagetx.export") from error
    return model_from_folder(folder, map_location)


def meant_as_local_path(name: str | os.PathLike) -> bool:
    """Whether ``name`` can only be a path on this machine: a Path, absolute, starting with ./, ../
    or ~, more than one '/' (a Hub id is owner/name), or whose first part is a folder here
    (pretrained/typo, where pretrained/ exists), or the shipped models' folder (pretrained/typo from
    any folder). Anything else may be a Hub repository id."""
    text = os.fspath(name)
    if isinstance(name, Path) or text.startswith(("/", "./", "../", "~")) or text.count("/") != 1:
        return True
    first = text.split("/")[0]
    return Path(first).is_dir() or (first == "pretrained" and shipped_folder(first).is_dir())


def push_to_hub(model: AutoregressiveModel, repo_id: str, *, token: str | None = None, private: bool | None = None,
                commit_message: str = "Upload an imagetx model", branch: str | None = None,
                create_pr: bool | None = None) -> str:
    """Upload ``model``'s weights folder (``save_pretrained``) to the Hub repository ``repo_id``,
    created if missing, in one commit. Returns the commit's URL."""
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id=repo_id, private=private, exist_ok=True).repo_id
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder)
        return str(api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message,
                                     revision=branch, create_pr=create_pr))
