"""FLOPs per image of every preset in configs/ (imagetx/model/flops.py), as a table and JSON.

    .venv/bin/python -m scripts.flops_table [--kernel flex] [--json flops.json]

``--kernel``: whose attention work is counted: ``sdpa`` (the gathered blocks, the CPU's
path) or ``flex`` (FlexAttention's 128×128 tiles, what the ``auto`` kernel runs on a
GPU); no GPU is needed to count either. Parameters are counted too."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from imagetx.model.flops import count_flops
from imagetx import build_model
from imagetx.training.presets import preset_model_config
from scripts.common import fmt

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GIGA = 1e9


def preset_flops(path: Path, kernel: str) -> dict:
    model = build_model(preset_model_config(path), kernel)
    flops = count_flops(model, "cpu")
    return {"preset": path.stem, "parameters": sum(p.numel() for p in model.parameters()),
            "forward_gflops": flops.forward / GIGA, "training_gflops": flops.training / GIGA,
            "attention_share": flops.attention / flops.forward}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", choices=("sdpa", "flex"), default="sdpa", help="whose attention work to count")
    parser.add_argument("--json", type=Path, default=Path("flops.json"))
    args = parser.parse_args(argv)
    rows = [preset_flops(path, args.kernel) for path in sorted(CONFIGS.glob("*.yaml"))]
    print(f"FLOPs per image, attention through {args.kernel}")
    print("| preset | parameters | forward GFLOP | training GFLOP | attention share |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| `{row['preset']}` | {fmt(row['parameters'] / 1e6, '.2f')} M | {fmt(row['forward_gflops'], '.1f')} | "
              f"{fmt(row['training_gflops'], '.1f')} | {fmt(100 * row['attention_share'], '.0f')} % |")
    args.json.write_text(json.dumps({"kernel": args.kernel, "presets": rows}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
