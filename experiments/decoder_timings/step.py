"""Median wall microseconds of one eager decoding step of B images (default 2), quick's model (random
weights, one thread), over 3 x 1,024 steps: python step.py TREE [B]."""
import sys, time, torch, imagetx, statistics
torch.set_num_threads(1)
from imagetx import build_model
from imagetx.model.sampler import first_input
from imagetx.training.presets import preset_model_config
tree, batch = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
assert imagetx.__file__.startswith(tree)
torch.manual_seed(0)
model = build_model(preset_model_config(tree + "/configs/quick.yaml")).eval()
times = []
with torch.no_grad():
    for rep in range(3):
        cache = model.start_decoding(batch); value = first_input(model, batch)
        for s in range(model.order.length):
            t = time.perf_counter(); model.decode_step(value, cache); times.append(time.perf_counter() - t)
print(statistics.median(times) * 1e6)
