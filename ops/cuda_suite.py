"""Which CUDA tests a GPU lease runs (ops/README.md, "A lease, call by call").

The whole CUDA suite (FlexAttention's values and gradients against the dense reference for every
pattern and kernel block size, the CUDA-graph decoding step, sampling without per-step syncs) takes
minutes of a 15-minute lease. It is run again only when a file it covers has changed since it last
passed on a GPU, as `ops/cuda_suite_passed.json` records (a SHA-256 of those files); otherwise a
lease runs the checks its training run depends on: FlexAttention's values and gradients against
the dense reference for every pattern and block size (rotary positions are applied outside the
kernel), its tile options, and which kernel `auto` picks.

    python ops/cuda_suite.py selection             # the pytest arguments for this tree
    python ops/cuda_suite.py record OUT --device D --passed N   # after a whole-suite pass
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "ops" / "cuda_suite_passed.json"
# What the CUDA tests exercise: the model package, the two test files and what they import.
COVERED = ("imagetx/model/*.py", "tests/model/test_flex_attention.py", "tests/model/test_sampler.py", "tests/helpers.py",
           "tests/conftest.py", "scripts/common.py")
WHOLE_SUITE = ["tests/model/test_sampler.py", "tests/model/test_flex_attention.py", "-k", "cuda"]
RUN_CHECKS = ["tests/model/test_flex_attention.py", "-k", "cuda"]


def covered_files(root: Path = REPO) -> list[Path]:
    return sorted({path for pattern in COVERED for path in root.glob(pattern)})


def files_sha256(root: Path = REPO) -> str:
    """One digest of the covered files' paths and contents (a renamed or removed file changes it)."""
    digest = hashlib.sha256()
    for path in covered_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def recorded_sha256(record: Path = RECORD) -> str | None:
    try:
        return json.loads(record.read_text())["files_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no record, or one unreadable: the whole suite runs


def selection(root: Path = REPO, record: Path = RECORD) -> tuple[str, list[str]]:
    """("whole", args) when a covered file changed since the recorded pass, else ("checks", args)."""
    return ("checks", RUN_CHECKS) if recorded_sha256(record) == files_sha256(root) else ("whole", WHOLE_SUITE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("selection", help="print 'whole' or 'checks', then the pytest arguments, one a line")
    record = sub.add_parser("record", help="write a record of a whole-suite pass of this tree")
    record.add_argument("out", type=Path)
    record.add_argument("--device", required=True)
    record.add_argument("--passed", type=int, required=True, help="how many tests passed")
    args = parser.parse_args(argv)
    if args.command == "selection":
        kind, pytest_args = selection()
        print("\n".join([kind, *pytest_args]))
    else:
        import torch

        args.out.write_text(json.dumps({
            "files_sha256": files_sha256(), "covered": list(COVERED), "passed": args.passed,
            "device": args.device, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
        }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
