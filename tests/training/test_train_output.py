"""What a training run says and writes besides the model (issue 74): a Ctrl-C ends it with one line
and exit code 130 (item 12); metrics.csv's steps never run backwards and plot_curve reads a resumed
run's CSV versions as one curve (item 13); other libraries' warnings that every run printed are
gone (item 14)."""

from __future__ import annotations

import csv
import logging
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import lightning as L
import pytest
import yaml

from helpers import train_metrics, write_train_config
from imagetx.train import main
from test_continuation import wsd_config

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

REPO = Path(__file__).resolve().parents[2]


class InterruptAt(L.Callback):
    """Sends this process SIGINT (what Ctrl-C sends) ``times`` times at the end of the given step."""

    def __init__(self, step: int, times: int = 1) -> None:
        self.step, self.times = step, times

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            for _ in range(self.times):
                signal.raise_signal(signal.SIGINT)


# ----- item 12: Ctrl-C ---------------------------------------------------------------------------

@pytest.mark.parametrize("times,saved", [(1, 3), (2, 2)], ids=["once", "twice"])
def test_a_training_stopped_by_ctrl_c_says_so_in_one_line_and_exits_130(tmp_path, data_root, capsys, caplog, times,
                                                                          saved):
    """Ctrl-C ends the step under way, writes last.ckpt there and stops: nothing is lost, and the
    run resumed from it ends exactly as the uninterrupted one. A second Ctrl-C stops at once, from
    the checkpoint before. Either way one line (Lightning exits 1, and the run looked failed) and 130."""
    caplog.set_level(logging.INFO)
    run_dir = tmp_path / "run"
    config = write_train_config(tmp_path / "c.yaml", run_dir, data_root, max_steps=6, val_check_interval=10,
                                top={"checkpoint_every_n_steps": 2},
                                callbacks=[{"class_path": "test_train_output.InterruptAt",
                                            "init_args": {"step": 3, "times": times}}])
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN where a shell started us in the background
    with pytest.raises(SystemExit) as info:
        main(["--config", str(config), "--wandb", "disabled"])
    assert info.value.code == 130
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C after the run: as before
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    last = run_dir / "checkpoints" / "last.ckpt"
    assert lines[-1] == (f"stopped: training interrupted (Ctrl-C) after step 3; {last} holds step {saved}: go on "
                         "with the same command and --resume auto (or --resume last); evaluate it with: python -m "
                         f"imagetx.evaluate --ckpt {last} --data.root {data_root} --val_size 2 --split val"), lines
    assert "Traceback" not in err and not any(line.startswith("error:") for line in lines)
    assert "Detected KeyboardInterrupt" not in caplog.text  # Lightning's line: ours says more
    # The way on that the line names works: the run ends as asked, as the uninterrupted run did.
    values = yaml.safe_load(config.read_text())
    values["trainer"].pop("callbacks")
    config.write_text(yaml.safe_dump(values))
    main(["--config", str(config), "--wandb", "disabled", "--resume", "last"])
    assert max(train_metrics(run_dir)) == 5  # (train/bpd of update N is logged at step N - 1)
    if times == 1:
        main(["--config", str(config), "--wandb", "disabled", "--trainer.default_root_dir", str(tmp_path / "whole")])
        assert train_metrics(run_dir) == train_metrics(tmp_path / "whole")


# ----- item 13: metrics.csv and plot_curve --------------------------------------------------------

def test_metrics_steps_never_run_backwards_and_plot_curve_reads_a_resumed_run_as_one(tmp_path, data_root):
    # Three validation batches per validation, every step logged: Lightning's ThroughputMonitor
    # logged the validation's throughput at steps 1, 2, 3, 4, ... (counting validation batches).
    run_dir = tmp_path / "run"
    config = write_train_config(tmp_path / "c.yaml", run_dir, data_root, max_steps=4, data={"val_size": 6},
                                limit_val_batches=3)
    main(["--config", str(config), "--wandb", "disabled"])
    main(["--config", str(config), "--wandb", "disabled", "--trainer.max_steps", "8", "--resume", "last"])
    versions = sorted(run_dir.glob("csv/version_*/metrics.csv"))
    assert len(versions) == 2  # a resumed run writes a version of its own
    for path in versions:
        rows = list(csv.DictReader(path.open()))
        steps = [int(row["step"]) for row in rows]
        assert steps == sorted(steps), (path, steps)
        assert not [key for key in rows[0] if key.startswith("validate/")]
    # Each version's train/time starts at 0; read as one run, time goes on across the resume.
    from scripts.plot_curve import read_curve, read_rows

    rows = read_rows(run_dir)
    times = [(int(row["step"]), float(row["train/time"])) for row in rows if row.get("train/time")]
    assert [step for step, _ in times] == sorted(step for step, _ in times)
    assert all(later > earlier for (_, earlier), (_, later) in zip(times, times[1:])), times
    val, train = read_curve(run_dir)
    assert len(train) == 8 and len(val) == 4  # every update once; validations after steps 2, 4, 6, 8
    assert read_curve(run_dir / "csv") == (val, train)
    assert read_curve(versions[0])[1] == train[:4]  # one metrics.csv, as before


def write_metrics(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, ["step", "train/bpd", "train/time", "train/samples", "val/bpd"])
        writer.writeheader()
        writer.writerows(rows)


def test_plot_curve_lets_a_resumed_version_replace_the_steps_it_took_again(tmp_path):
    # Killed after step 5 with last.ckpt from step 3: version 1 starts again at step 3.
    from scripts.plot_curve import read_rows

    run_dir = tmp_path / "run"
    write_metrics(run_dir / "csv" / "version_0" / "metrics.csv",
                  [{"step": step, "train/bpd": 8 - step / 10, "train/time": step, "train/samples": 2 * step}
                   for step in range(6)])
    write_metrics(run_dir / "csv" / "version_1" / "metrics.csv",
                  [{"step": step, "train/bpd": 7 - step / 10, "train/time": step - 2, "train/samples": 2 * (step - 2)}
                   for step in range(3, 8)])
    (run_dir / "csv" / "version_10").mkdir()  # read as 10, after 1 (and empty: nothing to read)
    rows = read_rows(run_dir)
    assert [int(row["step"]) for row in rows] == list(range(8))
    assert [float(row["train/bpd"]) for row in rows][2:4] == [7.8, 6.7]  # step 3 from the resumed version
    # time and images go on from step 2's (the last row before the resume): 2 + 1 at step 3
    assert [float(row["train/time"]) for row in rows] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert [float(row["train/samples"]) for row in rows] == [0, 2, 4, 6, 8, 10, 12, 14]


# ----- item 14: warnings every run printed --------------------------------------------------------

NOISE = ("LeafSpec", "Checkpoint directory", "dirpath has changed", "anonymous setting")


def test_a_run_a_resume_and_a_continuation_warn_of_nothing(tmp_path, data_root):
    # Lightning's LeafSpec deprecation (twice a run), "Checkpoint directory ... exists and is not
    # empty" on every resume, "The dirpath has changed" on every continued run.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # (imagetx's own filters go in front of this one)
        first = wsd_config(tmp_path, "first", data_root, 6, 0.5,
                           callbacks=[{"class_path": "test_train_output.InterruptAt", "init_args": {"step": 4}}])
        with pytest.raises(SystemExit):  # Ctrl-C after step 4; the resume below trains the rest
            main(["--config", str(first), "--wandb", "disabled"])
        values = yaml.safe_load(first.read_text())
        values["trainer"].pop("callbacks")
        first.write_text(yaml.safe_dump(values))
        main(["--config", str(first), "--wandb", "disabled", "--resume", "last"])
        continued = wsd_config(tmp_path, "continued", data_root, 9, 0.5)
        main(["--config", str(continued), "--wandb", "disabled", "--resume",
              str(tmp_path / "first" / "checkpoints" / "continue.ckpt")])
    said = [str(warning.message) for warning in caught]
    assert not [message for message in said if any(noise in message for noise in NOISE)], said


@pytest.mark.slow
def test_a_run_with_wandb_prints_no_warning_of_other_libraries(tmp_path, data_root):
    # W&B's "The anonymous setting has no effect" (printed once per process, so in a process of
    # its own), with Lightning's LeafSpec deprecation, on every run with W&B on.
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, max_steps=2)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "WANDB_MODE": "offline"}
    env.pop("WANDB_SILENT", None)
    done = subprocess.run([sys.executable, "-m", "imagetx.train", "--config", str(config), "--wandb", "auto"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*")), "W&B ran"
    assert not [noise for noise in NOISE if noise in done.stderr], done.stderr
