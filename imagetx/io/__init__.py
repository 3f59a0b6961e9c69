"""Files: the shareable weights folder (safetensors + config.json), training checkpoints read
as data only, atomic writes, and images read from and written to disk. Below the training
stack: opening a model needs torch, safetensors and huggingface_hub, never Lightning."""
