"""The distribution augmentation study's table (docs/experiments.md entry 40, issue 127): each run of
experiments/distribution_augmentation.sh with its validations (val bits/dim during training, on all
5,000 val images) and its end (``val.json``: ``imagetx.evaluate``, the identity transform), then each
arm's mean over its finished seeds, their spread (max − min) and the difference from the flips arm.

    .venv/bin/python -m experiments.distribution_augmentation_table [--results DIR] [--json table.json]

The flips arm is ``flips_s*`` where finished; entry 38's rehearsal of the same schedule with flips
(experiments/recipe_rehearsal_results, seed 0, an older commit's code) stands in until one is, and
is marked so. A win (issue 127) is an arm whose mean is below the flips arm's by more than the larger
of the two arms' spreads; with one seed in either, no spread is known and the verdict waits (an arm
whose one end is above the two-seed flips mean can no longer win: the verdict says so).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
from pathlib import Path
from statistics import mean

from experiments.json_result import emit
from scripts.plot_curve import read_rows

RESULTS = Path(__file__).resolve().parent / "distribution_augmentation_results"
REHEARSAL = Path(__file__).resolve().parent / "recipe_rehearsal_results"


def validations(folder: Path) -> dict[int, float]:
    """{step: val bits/dim} of a run: its CSVLogger versions joined by ``read_rows`` (a resumption's rows
    replacing the earlier versions' from its first step on), or, for entry 38's rehearsal, the pieces
    of its metrics committed as .csv.gz."""
    if (folder / "csv").is_dir():
        rows = read_rows(folder)
    else:
        rows = []
        for path in sorted(folder.glob("metrics*.csv.gz")):
            with gzip.open(path, "rt") as handle:
                rows += csv.DictReader(handle)
    return dict(sorted((int(row["step"]), float(row["val/bpd"])) for row in rows if row.get("val/bpd")))


def run_record(folder: Path) -> dict:
    """One run's validations and end (None while it has not ended)."""
    end = folder / "val.json"
    # Empty while evaluate runs, as distribution_augmentation.sh made it before it wrote val.json.part: not ended yet
    text = end.read_text() if end.is_file() else ""
    return {"validations": validations(folder), "end": json.loads(text)["bpd"] if text.strip() else None}


def table(results: Path) -> dict:
    runs = {folder.name: run_record(folder) for folder in sorted(results.iterdir()) if folder.is_dir()}
    arms: dict[str, list[float]] = {}
    for name, record in runs.items():
        if record["end"] is not None:
            arms.setdefault(name.rsplit("_s", 1)[0], []).append(record["end"])
    stand_in = None
    if "flips" not in arms and (REHEARSAL / "val.json").is_file():
        stand_in = json.loads((REHEARSAL / "val.json").read_text())["bpd"]
        arms["flips"] = [stand_in]
        runs["flips (entry 38's rehearsal)"] = {"validations": validations(REHEARSAL), "end": stand_in}
    summary = {arm: {"seeds": len(ends), "mean": mean(ends), "spread": max(ends) - min(ends) if len(ends) > 1 else None}
               for arm, ends in sorted(arms.items())}
    flips = summary.get("flips")
    for arm, entry in summary.items():
        if flips is None or arm == "flips":
            continue
        entry["minus_flips"] = entry["mean"] - flips["mean"]
        if entry["spread"] is None or flips["spread"] is None:
            entry["verdict"] = "waits for a second seed"
            # A second end x can not make a win from a first end s above the flips mean F: x >= s keeps the
            # mean above F; x < s makes the margin at least s - x, and (s + x)/2 < F - (s - x) needs x > 3s - 2F > s.
            if flips["spread"] is not None and entry["mean"] > flips["mean"]:
                entry["verdict"] += ", which cannot make a win (its first end is above flips')"
        else:
            margin = max(entry["spread"], flips["spread"])
            entry["verdict"] = ("win" if entry["minus_flips"] < -margin else
                                "loss" if entry["minus_flips"] > margin else "within the seeds' spread")
    return {"runs": runs, "arms": summary, "flips_stand_in": stand_in}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        parser.error(f"--results {args.results}: no such folder (the study's runs, experiments/distribution_augmentation.sh)")
    result = table(args.results)
    for name, record in result["runs"].items():
        steps = ", ".join(f"{value:.4f} @{step:,}" for step, value in record["validations"].items())
        end = "running" if record["end"] is None else f"{record['end']:.4f}"
        print(f"{name:42s} val {steps or '-'}; end {end}")
    if result["flips_stand_in"] is not None:
        print(f"flips: no flips_s* run has ended; entry 38's rehearsal stands in ({result['flips_stand_in']:.4f})")
    for arm, entry in result["arms"].items():
        spread = "-" if entry["spread"] is None else f"{entry['spread']:.4f}"
        versus = f", {entry['minus_flips']:+.4f} against flips: {entry['verdict']}" if "verdict" in entry else ""
        print(f"{arm:42s} {entry['seeds']} seed(s), mean {entry['mean']:.4f}, spread {spread}{versus}")
    emit(result, args.json)
    return result


if __name__ == "__main__":
    main()
