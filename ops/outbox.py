"""What a lent machine sends home, a call at a time (ops/README.md, "A lease, call by call"). A call
brings back the files in its $OUT, at most 8 of at most 16 MiB, 64 MiB together (the device tool's
limits); a lease's results can be more (at 28 layers: the continuation 56.4 MiB, the model 28.2).
So they are queued in an outbox, in the order they matter, and each call sends what it has room
for, each file once: the run's `wait` the continuation as soon as the run has written it, `finish`
the model and what is left beside results.tar, `more` (a call of its own) the rest. ``home``
(ops/lease_record.py) takes every call's folder.

    python ops/outbox.py queue OUTBOX FILE...                      # copied in, to be sent in this order
    python ops/outbox.py send OUTBOX OUT [--keep-files N] [--keep-mib M] [--again]

``--keep-*``: room left in OUT for what the call writes after (``finish``'s results.tar). ``--again``:
the queue from its start, where a call's files did not come back. The limits are options (and the
lease script's environment), so that CI's dry run can exercise them with a tiny model.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

MiB = 2**20
QUEUE = "queue.json"  # [{"name", "bytes", "sent"}] in the order to send


def read_queue(outbox: Path) -> list[dict]:
    return json.loads((outbox / QUEUE).read_text()) if (outbox / QUEUE).exists() else []


def queue(outbox: Path, files: list[Path], file_mib: float) -> None:
    """``files`` copied into ``outbox`` after what is queued there; a file larger than one call can
    bring back is refused (split it first: ``python -m imagetx.io.parts split``)."""
    outbox.mkdir(parents=True, exist_ok=True)
    entries = read_queue(outbox)
    for path in files:
        size = path.stat().st_size
        if size > file_mib * MiB:
            raise ValueError(f"{path} is {size / MiB:.1f} MiB, more than a call brings back in one file "
                             f"({file_mib:g} MiB): split it into parts first (python -m imagetx.io.parts split)")
        shutil.copy(path, outbox / path.name)
        entries = [entry for entry in entries if entry["name"] != path.name]  # queued again: its newest copy
        entries.append({"name": path.name, "bytes": size, "sent": False})
    (outbox / QUEUE).write_text(json.dumps(entries, indent=1))


def send(outbox: Path, out: Path, files: int, total_mib: float, keep_files: int = 0, keep_mib: float = 0,
         again: bool = False) -> tuple[list[str], list[str]]:
    """What of the queue fits ``out`` beside what is there already and the room kept, copied into it in
    the queue's order and marked sent; returns (sent now, still waiting)."""
    entries = read_queue(outbox)
    if again:
        for entry in entries:
            entry["sent"] = False
    there = [path for path in out.iterdir() if path.is_file()]
    count, used = len(there) + keep_files, sum(path.stat().st_size for path in there) + keep_mib * MiB
    sent, waiting = [], []
    for entry in entries:
        if entry["sent"]:
            continue
        if count + 1 <= files and used + entry["bytes"] <= total_mib * MiB:
            shutil.copy(outbox / entry["name"], out / entry["name"])
            entry["sent"] = True
            count, used = count + 1, used + entry["bytes"]
            sent.append(entry["name"])
        else:
            waiting.append(entry["name"])
    (outbox / QUEUE).write_text(json.dumps(entries, indent=1))
    return sent, waiting


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    q = verbs.add_parser("queue", help="files into the outbox, to be sent in this order")
    q.add_argument("outbox", type=Path)
    q.add_argument("files", type=Path, nargs="+")
    q.add_argument("--file-mib", type=float, default=16, help="the largest file a call brings back")
    s = verbs.add_parser("send", help="what of the outbox fits this call's OUT")
    s.add_argument("outbox", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--files", type=int, default=8, help="the most files a call brings back")
    s.add_argument("--total-mib", type=float, default=64, help="the most MiB a call brings back")
    s.add_argument("--keep-files", type=int, default=0, help="files' room kept for what the call writes after")
    s.add_argument("--keep-mib", type=float, default=0, help="MiB kept for what the call writes after")
    s.add_argument("--again", action="store_true", help="send the queue again from its start")
    options = parser.parse_args(argv)
    try:
        if options.verb == "queue":
            queue(options.outbox, options.files, options.file_mib)
            return
        sent, waiting = send(options.outbox, options.out, options.files, options.total_mib, options.keep_files,
                             options.keep_mib, options.again)
    except (OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"in $OUT: {' '.join(sent) or 'nothing new'}")
    if waiting:
        print(f"left for 'bash ops/gpu_lease.sh more' (a call of its own, while the machine is warm): {' '.join(waiting)}")


if __name__ == "__main__":
    main()
