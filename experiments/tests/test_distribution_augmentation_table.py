"""experiments/distribution_augmentation_table.py: each arm's mean over its finished seeds, its spread,
and the verdict against flips, from a results folder laid out as distribution_augmentation.sh leaves it."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from experiments.distribution_augmentation_table import main, table, validations


def fake_run(results, name: str, validations: dict[int, float], end: float | None) -> None:
    """A run folder: CSVLogger's metrics split over two versions (a resumption), and val.json once ended."""
    folder = results / name
    steps = sorted(validations)
    for version, part in enumerate((steps[:1], steps[1:])):
        csv = folder / "csv" / f"version_{version}"
        csv.mkdir(parents=True)
        rows = "".join(f"0,{step},,{validations[step]}\n0,{step},1.5,\n" for step in part)
        (csv / "metrics.csv").write_text("epoch,step,train/bpd,val/bpd\n" + rows)
    if end is not None:
        (folder / "val.json").write_text(json.dumps({"bpd": end, "images": 5000, "split": "val"}))


def test_means_spreads_and_verdicts_against_flips(tmp_path):
    fake_run(tmp_path, "flips_s0", {8599: 4.0, 17199: 3.5}, 3.40)
    fake_run(tmp_path, "flips_s1", {8599: 4.1, 17199: 3.6}, 3.42)
    fake_run(tmp_path, "channels_s0", {8599: 4.2, 17199: 3.7}, 3.30)  # below flips by 0.11, spread 0.02
    fake_run(tmp_path, "channels_s1", {8599: 4.2, 17199: 3.7}, 3.32)
    fake_run(tmp_path, "rotations_s0", {8599: 4.3, 17199: 3.8}, 3.50)  # above by 0.09
    fake_run(tmp_path, "rotations_s1", {8599: 4.3, 17199: 3.8}, 3.52)
    fake_run(tmp_path, "transposition_s0", {8599: 4.0, 17199: 3.5}, 3.40)  # within the spread
    fake_run(tmp_path, "transposition_s1", {8599: 4.0, 17199: 3.5}, 3.43)
    fake_run(tmp_path, "rotations_transposition_s0", {8599: 4.0, 17199: 3.5}, 3.20)
    fake_run(tmp_path, "rotations_transposition_s1", {8599: 4.0}, None)  # still running: one seed so far
    fake_run(tmp_path, "channels_transposition_s0", {8599: 4.0}, 3.43)  # one seed, above flips' mean
    fake_run(tmp_path, "channels_transposition_s1", {8599: 4.0}, None)
    (tmp_path / "channels_transposition_s1" / "val.json").write_text("")  # evaluate under way: not ended
    result = table(tmp_path)
    arms = result["arms"]
    assert result["flips_stand_in"] is None  # flips_s* ended: no stand-in
    assert math.isclose(arms["flips"]["mean"], 3.41) and math.isclose(arms["flips"]["spread"], 0.02)
    assert math.isclose(arms["channels"]["minus_flips"], -0.1) and arms["channels"]["verdict"] == "win"
    assert arms["rotations"]["verdict"] == "loss"
    assert arms["transposition"]["verdict"] == "within the seeds' spread"
    assert arms["rotations_transposition"]["seeds"] == 1
    assert arms["rotations_transposition"]["verdict"] == "waits for a second seed"  # below flips: may win
    assert arms["channels_transposition"]["seeds"] == 1
    assert arms["channels_transposition"]["verdict"].endswith("cannot make a win (its first end is above flips')")
    assert result["runs"]["channels_transposition_s1"]["end"] is None
    # both versions' validations are read, the running run's too
    assert result["runs"]["channels_s0"]["validations"] == {8599: 4.2, 17199: 3.7}
    assert result["runs"]["rotations_transposition_s1"] == {"validations": {8599: 4.0}, "end": None}


def test_rehearsal_pieces_read_from_csv_gz(tmp_path):
    """Entry 38's rehearsal keeps its metrics as .csv.gz pieces, not CSVLogger versions: every piece is read."""
    for name, step, value in (("metrics.to-step-2197.csv.gz", 2197, 4.5), ("metrics.csv.gz", 8599, 3.98)):
        with gzip.open(tmp_path / name, "wt") as handle:
            handle.write(f"epoch,step,train/bpd,val/bpd\n0,{step},,{value}\n0,{step},1.5,\n")
    assert validations(tmp_path) == {2197: 4.5, 8599: 3.98}


def test_missing_results_folder_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--results", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2
    assert "no such folder" in capsys.readouterr().err
