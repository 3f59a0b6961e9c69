"""How the analysis scripts hand back their result: one JSON object as the last line of
standard output (what tests and other scripts parse) and, with ``--json PATH``, the same
object indented in that file."""

from __future__ import annotations

import json


def emit(result: dict, path: str | None) -> None:
    print(json.dumps(result))
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
