"""CPU seconds of sampling 64 images with quick's model (random weights, one thread), eager or compiled,
after one untimed sample of 64 (which compiles): python sample64.py TREE eager|compiled."""
import sys, time, torch, imagetx
torch.set_num_threads(1)
from imagetx import build_model
from imagetx.model.sampler import sample
from imagetx.training.presets import preset_model_config
tree, compiled = sys.argv[1], sys.argv[2] == "compiled"
assert imagetx.__file__.startswith(tree)
torch.manual_seed(0)
model = build_model(preset_model_config(tree + "/configs/quick.yaml")).eval()
sample(model, 64, generator=torch.Generator().manual_seed(1), compiled=compiled)  # warm: compiles
start = time.process_time()
sample(model, 64, generator=torch.Generator().manual_seed(1), compiled=compiled)
print(time.process_time() - start)
