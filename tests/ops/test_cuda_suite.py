"""ops/cuda_suite.py: a lease runs the whole CUDA suite when a file it covers changed since the
recorded pass, else the checks its training run depends on."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from ops import cuda_suite

REPO = Path(__file__).resolve().parents[2]


def copy_of_covered(root: Path) -> Path:
    for path in cuda_suite.covered_files(REPO):
        target = root / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    return root


def record_for(root: Path, record: Path) -> Path:
    record.write_text(json.dumps({"files_sha256": cuda_suite.files_sha256(root)}))
    return record


def test_a_matching_record_runs_the_checks_and_any_change_the_whole_suite(tmp_path):
    root = copy_of_covered(tmp_path / "tree")
    record = record_for(root, tmp_path / "passed.json")
    assert cuda_suite.selection(root, record) == ("checks", cuda_suite.RUN_CHECKS)

    kernels = root / "imagetx" / "model" / "attention.py"
    kernels.write_text(kernels.read_text() + "\n# changed\n")
    assert cuda_suite.selection(root, record) == ("whole", cuda_suite.WHOLE_SUITE)

    record_for(root, record)  # the whole suite passed on the changed tree
    assert cuda_suite.selection(root, record)[0] == "checks"
    (root / "imagetx" / "model" / "new_kernel.py").write_text("")  # a file added is a change too
    assert cuda_suite.selection(root, record)[0] == "whole"


def test_no_record_or_a_damaged_one_runs_the_whole_suite(tmp_path):
    root = copy_of_covered(tmp_path / "tree")
    assert cuda_suite.selection(root, tmp_path / "missing.json")[0] == "whole"
    damaged = tmp_path / "damaged.json"
    damaged.write_text("{not json")
    assert cuda_suite.selection(root, damaged)[0] == "whole"


def test_the_repository_record_names_a_digest_and_the_checks_select_the_cuda_tests():
    record = json.loads(cuda_suite.RECORD.read_text())
    assert re.fullmatch(r"[0-9a-f]{64}", record["files_sha256"]) and record["passed"] > 0
    assert "tests/model/test_flex_attention.py" in cuda_suite.RUN_CHECKS and "cuda" in cuda_suite.RUN_CHECKS[-1]
