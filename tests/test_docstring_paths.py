"""Every module path that the package's docstrings and comments name resolves: a file path
(``model/patterns.py``, ``imagetx/io/hub.py``) names a file of the package, a dotted name
(``imagetx.model.sampler.sample``) a module of it, and what follows the module a name that the
module defines; and every test file that the package, the documents and the tooling name exists.
So that a moved module or test leaves no stale pointer behind."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "imagetx"
LAYERS = ("model", "io", "data", "training", "cli", "demo")
FILE_PATH = re.compile(r"(?<![\w/.])(?:imagetx/)?((?:%s)/[\w/]+\.py)" % "|".join(LAYERS))
DOTTED = re.compile(r"(?<![\w.])imagetx(?:\.\w+)+")
TEST_PATH = re.compile(r"(?<![\w/.])(?:experiments/)?tests/[\w/]*test_\w+\.py")
# Where a reader is sent to a test: the package, the documents, the tooling and the CI script.
# (Not ops/cuda_suite_passed.json: a record of what passed then, under the names of then.)
NAMING_TESTS = ("imagetx/**/*.py", "*.md", "docs/*.md", "pretrained/**/*.md", "experiments/*.md", "ops/*.py", "ops/*.sh",
                "ops/*.md", "ops/*.txt", "scripts/*.py", ".ci/run")


def defines(path: Path, name: str) -> bool:
    return re.search(rf"^\s*(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|import.*\b{name}\b",
                     path.read_text(), re.MULTILINE) is not None


def unresolved(text: str) -> list[str]:
    missing = [f"{path} (no such file)" for path in FILE_PATH.findall(text) if not (PACKAGE / path).is_file()]
    for dotted in DOTTED.findall(text):
        parts = dotted.rstrip(".").split(".")[1:]
        for cut in range(len(parts), -1, -1):
            base = PACKAGE.joinpath(*parts[:cut])
            module = base.with_suffix(".py") if cut else PACKAGE / "__init__.py"
            module = module if module.is_file() else base / "__init__.py"
            if module.is_file():
                rest = parts[cut:]
                if rest and not defines(module, rest[0]):
                    missing.append(f"{dotted} ({module.relative_to(PACKAGE.parent)} defines no {rest[0]})")
                break
    return missing


def test_every_module_path_named_in_the_package_resolves():
    stale = [f"{path.relative_to(PACKAGE.parent)}: {name}" for path in sorted(PACKAGE.rglob("*.py"))
             for name in unresolved(path.read_text())]
    assert stale == []


def test_the_check_catches_a_stale_path():
    # Negative control: a moved module and a name its module does not define are caught.
    assert unresolved("see model/hub.py and ``imagetx.model.sampler.no_such_function``") == [
        "model/hub.py (no such file)",
        "imagetx.model.sampler.no_such_function (imagetx/model/sampler.py defines no no_such_function)"]
    assert unresolved("``imagetx.model.sampler.sample``, imagetx/io/hub.py, python -m imagetx.train") == []


def test_every_test_file_named_exists():
    named = {(path.relative_to(REPO), test) for pattern in NAMING_TESTS for path in REPO.glob(pattern)
             if path.is_file() for test in TEST_PATH.findall(path.read_text(errors="replace"))}
    assert len(named) > 50  # the documents do send readers to tests
    assert sorted(f"{path}: {test}" for path, test in named if not (REPO / test).is_file()) == []
    assert TEST_PATH.findall("see tests/test_moved.py and tests/model/test_sampler.py") == [
        "tests/test_moved.py", "tests/model/test_sampler.py"]  # the check reads both forms


def test_the_package_says_nothing_of_leases():
    """Leases of GPU time are the project's tooling (ops/), which the library knows nothing of: a
    user reading imagetx's docstrings (``python -m imagetx.training.grow --help``) meets no such
    word, which nothing there defines."""
    speaking = [str(path.relative_to(REPO)) for path in sorted(PACKAGE.rglob("*.py"))
                if re.search(r"\bleases?\b", path.read_text(), re.IGNORECASE)]
    assert not speaking, speaking
