"""The control of issue 125 step 7: the committed format-6 files (tests/assets/codec_format6) decoded with
the decoding step a format's files were coded with (the codec's whole ring for formats 1 to 6) and,
as the control, with the model's own step (``BLOCK_KEYS_VERSION`` set to 1: every format decoded so).
Prints, per file, whether its pixels came back; run with portable arithmetic, as the files were coded:

    ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE .venv/bin/python experiments/codec_format_control.py 7   # kept
    ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE .venv/bin/python experiments/codec_format_control.py 1   # control
"""
import sys, numpy as np
import imagetx.codec.whole_ring as w
w.BLOCK_KEYS_VERSION = int(sys.argv[1])
from imagetx import load_model
from imagetx.codec import decompress
for name, ckpt, imgs in [("completion_val_first2", "pretrained/completion", None), ("tiny_local2d", "tests/assets/codec_format6/tiny_local2d", "tiny_local2d_images"), ("tiny_full", "tests/assets/codec_format6/tiny_full", "tiny_full_images")]:
    data = open(f"tests/assets/codec_format6/{name}.itx", "rb").read()
    expected = np.load("tests/assets/cifar10_val_first32.npz")["images"][:2] if imgs is None else np.load(f"tests/assets/codec_format6/{imgs}.npz")["images"]
    try:
        out = decompress(load_model(ckpt), data)
        print(name, "equal" if np.array_equal(out, expected) else f"DIFFERENT: {int((out != expected).sum())} values differ")
    except Exception as e:
        print(name, "error:", str(e)[:200])
