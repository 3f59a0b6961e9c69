"""The model's files, one layer above the network (``imagetx.model``): the shareable weights folder
(safetensors + config.json), Hugging Face Hub sharing (``hub.py``), training checkpoints read as
data only, and files written whole or not at all. Opening a model needs torch, safetensors and
huggingface_hub, never Lightning."""
