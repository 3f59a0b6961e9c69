"""CPU seconds of build_model for a preset's model config (one thread): python build.py TREE PRESET."""
import sys, time, torch, imagetx
torch.set_num_threads(1)
from imagetx import build_model
from imagetx.training.presets import preset_model_config
tree, preset = sys.argv[1], sys.argv[2]
assert imagetx.__file__.startswith(tree)
config = preset_model_config(f"{tree}/configs/{preset}.yaml")
start = time.process_time(); build_model(config); print(time.process_time() - start)
