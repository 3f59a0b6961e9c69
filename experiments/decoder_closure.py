"""The decoder's import closure and how much of it is prose (issue 125's targets): transformer.py and
every module it imports relatively at module level, transitively (imports inside functions, as the
optional FlexAttention kernel's, and ``TYPE_CHECKING`` blocks left out), each file's lines, its code
lines and its prose lines (docstrings, and comments on lines of their own). One line a file, the
totals, then one JSON object.

    .venv/bin/python experiments/decoder_closure.py [--tree DIR]   # DIR: another worktree, e.g. an older commit's
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import tokenize
from pathlib import Path

START = Path("imagetx/model/transformer.py")
LAYOUT = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)


def imported(path: Path, level: int, module: str | None, names: list[str]) -> list[Path]:
    """The files a relative ``from`` import of ``path`` reads: the module, or each name that is one."""
    package = path.parent
    for _ in range(level - 1):
        package = package.parent
    base = package.joinpath(*module.split(".")) if module else package
    files = [base.with_suffix(".py")] if base.with_suffix(".py").exists() else []
    if not files and (base / "__init__.py").exists():
        files = [base / "__init__.py"] + [base / f"{name}.py" for name in names if (base / f"{name}.py").exists()]
    return files


def closure(root: Path) -> list[Path]:
    seen, pending = set(), [root / START]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.parse(path.read_text()).body:  # module level only
            if isinstance(node, ast.ImportFrom) and node.level:
                pending.extend(imported(path, node.level, node.module, [alias.name for alias in node.names]))
    return sorted(seen)


def code_and_prose(text: str) -> tuple[int, int]:
    """Lines of code, and lines of prose: docstrings, and comments on lines that hold no code."""
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    comments, code = set(), set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comments.add(token.start[0])
        elif token.type not in LAYOUT:
            code.update(line for line in range(token.start[0], token.end[0] + 1) if line not in docstrings)
    return len(code), len(docstrings) + len(comments - code)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    root = parser.parse_args(argv).tree.resolve()
    files = {}
    for path in closure(root):
        text = path.read_text()
        code, prose = code_and_prose(text)
        files[str(path.relative_to(root))] = {"lines": len(text.splitlines()), "code": code, "prose": prose}
        print(f"{files[str(path.relative_to(root))]['lines']:6d} lines {code:5d} code {prose:5d} prose "
              f"({prose / max(code, 1):.2f})  {path.relative_to(root)}")
    totals = {key: sum(counts[key] for counts in files.values()) for key in ("lines", "code", "prose")}
    totals["prose_per_code_line"] = round(totals["prose"] / totals["code"], 3)
    print(f"{len(files)} files, {totals['lines']:,} lines; {totals['prose_per_code_line']} prose lines a code line")
    result = {"files": files, "count": len(files), **totals}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
