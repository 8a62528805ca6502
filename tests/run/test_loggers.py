"""Where metrics go: the loggers registry (unknown names and missing packages refused before any model
loads) and each sink tested for real, its records read back with the tool's own reader."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grouprl.config import check
from grouprl.report.data import read_jsonl
from grouprl.run.folder import foreign_entries, remove_run_files
from grouprl.run.loggers import chosen, logger_problems, run_folders
from grouprl.run.loggers.wandb_sink import previous_id
from grouprl.trainer.config import TrainerConfig
from tests.helpers.trainer import make_trainer, tiny_args
from tests.run import wandb_files

ROOT = Path(__file__).resolve().parents[2]


def test_an_unknown_logger_is_refused_with_the_valid_names():
    from grouprl.control import ControlConfig

    message = ("loggers: unknown logger 'wandbb' (did you mean 'wandb'?); valid names: jsonl, tensorboard, "
               "trackio, wandb")
    with pytest.raises(ValueError, match=re.escape(message)):
        check(TrainerConfig(loggers=("wandbb",)))
    with pytest.raises(ValueError, match=re.escape(message)):
        ControlConfig(loggers=("wandbb",))


def test_a_missing_package_names_its_extra_before_any_model_loads(tmp_path, monkeypatch, capsys):
    from grouprl.cli import EXIT_BAD_INPUT, main

    monkeypatch.setitem(sys.modules, "trackio", None)  # importlib then finds no trackio
    with pytest.raises(ValueError, match=re.escape("loggers: trackio needs the trackio package, which is not "
                                                   "installed: pip install 'grouprl[trackio]'")):
        check(TrainerConfig(loggers=("trackio",)))

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the config was checked")

    monkeypatch.setattr("grouprl.cli.commands.load_model", no_model)
    assert main(["train", *tiny_args(tmp_path), "--loggers", "trackio"]) == EXIT_BAD_INPUT
    assert "pip install 'grouprl[trackio]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_which_sinks_a_run_opens():
    assert chosen((), tensorboard=False) == ["jsonl"]
    assert chosen(("wandb", "jsonl", "wandb"), tensorboard=False) == ["jsonl", "wandb"]
    assert chosen(("trackio",), tensorboard=True) == ["jsonl", "trackio", "tensorboard"]  # installed by the test extra
    assert logger_problems(("jsonl", "tensorboard", "trackio", "wandb"), tensorboard=True) == []
    assert logger_problems(("tensorboard",), tensorboard=False) == [
        "loggers names tensorboard but tensorboard is false: drop one of the two"]


def test_what_sinks_write_in_a_run_folder_is_the_runs_own(tmp_path):
    assert run_folders() == ("tensorboard", "wandb")
    for name in run_folders():
        (tmp_path / name / "x").mkdir(parents=True)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert foreign_entries(tmp_path) == []
    remove_run_files(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_resumed_run_continues_the_wandb_run_its_folder_last_made(tmp_path):
    assert previous_id(tmp_path) is None
    (tmp_path / "offline-run-20260101_120000-ab12cd34").mkdir()
    (tmp_path / "latest-run").symlink_to("offline-run-20260101_120000-ab12cd34")
    assert previous_id(tmp_path) == "ab12cd34"


def _logged(run: Path) -> dict[int, dict]:
    """metrics.jsonl's records by step (training and evaluation merged, as the trackers merge them)."""
    out: dict[int, dict] = {}
    for record in read_jsonl(run / "metrics.jsonl"):
        out.setdefault(record["step"], {}).update({k: v for k, v in record.items() if k not in ("step", "wall_time")})
    return out


def _numbers(record: dict) -> dict[str, float]:
    return {k: v for k, v in record.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def test_a_tiny_runs_metrics_reach_tensorboard_and_wandb_offline(tmp_path, monkeypatch, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    make_trainer(tmp_path, loggers=("tensorboard", "wandb"), progress=True).train()
    run = tmp_path / "run"
    logged = _logged(run)
    assert sorted(logged) == [0, 1, 2] and "eval/accuracy" in logged[0] and "reward/mean" in logged[2]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("grpo step")]
    assert [line.split("  ")[0] for line in lines] == ["grpo step 1/2", "grpo step 2/2"]  # not a terminal: lines
    assert f"reward {logged[2]['reward/mean']:.3f}" in lines[1] and "s/step" in lines[1]

    history = wandb_files.history(run / "wandb")
    assert sorted(history) == [0, 1, 2]
    for step, record in logged.items():
        assert history[step] == _numbers(record), f"step {step}: wandb holds other numbers than metrics.jsonl"

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    for key in ("reward/mean", "policy/kl", "eval/accuracy", "time/step"):
        steps = sorted(s for s, r in logged.items() if key in r)
        got = [(e.step, e.value) for e in events.Scalars(key)]
        assert [s for s, _ in got] == steps, key
        for (step, value), expected in zip(got, (logged[s][key] for s in steps)):
            # TensorBoard stores float32: one rounding, relative error <= 2**-24
            assert math.isclose(value, expected, rel_tol=2**-23, abs_tol=1e-30), (key, step, value - expected)


@pytest.mark.slow
def test_grouprl_train_piped_to_a_file_prints_a_line_per_step_and_feeds_every_sink(tmp_path):
    """The command line as a user pipes it: a plain line per step in the file (no bar), and every sink
    holding the run's metrics."""
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}
    args = [*tiny_args(tmp_path), "--progress", "--loggers", "tensorboard,trackio,wandb"]
    with open(tmp_path / "out.txt", "w") as out:
        done = subprocess.run([sys.executable, "-m", "grouprl", "train", *args], stdout=out, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = (tmp_path / "out.txt").read_text()
    steps = [line.split("  ")[0] for line in printed.splitlines() if line.startswith("grpo step")]
    assert steps == ["grpo step 1/2", "grpo step 2/2"], printed[-2000:]
    assert "\u2501" not in printed, "no bar in a file"
    ours = [line for line in printed.splitlines() if line.startswith(("grpo step", "step "))]
    assert len(ours) == 2 + 2 * 2 and not any("\x1b" in line for line in ours), ours  # trackio colours its own
    run = tmp_path / "run"
    logged = _logged(run)
    assert wandb_files.history(run / "wandb")[2]["reward/mean"] == logged[2]["reward/mean"]
    assert any((run / "tensorboard").iterdir())
    read = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps(S.get_logs('grouprl', 'run')))")
    stored = json.loads(subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, env=env,
                                       check=True).stdout.splitlines()[-1])
    # step 2 is two rows in trackio, as in metrics.jsonl: the training step's, then the final evaluation's
    assert [row.get("reward/mean") for row in stored if row["step"] == 2] == [logged[2]["reward/mean"], None]
    assert [row.get("eval/accuracy") for row in stored if row["step"] == 2] == [None, logged[2]["eval/accuracy"]]


TRACKIO_RUN = """
import json, sys
from pathlib import Path
from tests.helpers.trainer import make_trainer
from trackio.sqlite_storage import SQLiteStorage

make_trainer(Path(sys.argv[1]), loggers=("trackio",)).train()
print("STORED", json.dumps(SQLiteStorage.get_logs("grouprl", "run")))
"""


@pytest.mark.slow
def test_a_tiny_runs_metrics_reach_trackios_local_store(tmp_path):
    """In a process of its own: trackio reads TRACKIO_DIR (where its store lives) once, on import."""
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", TRACKIO_RUN, str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    stored = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("STORED "))[7:])
    logged = _logged(tmp_path / "run")
    got = {}
    for row in stored:
        got.setdefault(row["step"], {}).update({k: v for k, v in row.items() if k not in ("step", "timestamp")})
    assert sorted(got) == sorted(logged) == [0, 1, 2]
    for step, record in logged.items():
        assert got[step] == _numbers(record), f"step {step}: trackio holds other numbers than metrics.jsonl"
    assert (tmp_path / "trackio" / "grouprl.db").is_file()


TRACKIO_SINK = """
import json, sys
from pathlib import Path
from grouprl.run.loggers import RunInfo
from grouprl.run.loggers.trackio_sink import TrackioSink
from trackio.sqlite_storage import SQLiteStorage

folder = Path(sys.argv[1])
for resumed, records in ((False, [(1, 0.25), (2, 0.5)]), (True, [(3, 0.75)])):
    sink = TrackioSink(RunInfo(folder, {"lr": 0.001}, resumed, None))
    for step, reward in records:
        sink.log(step, {"reward/mean": reward, "note": "text", "done": True, "eval/accuracy": float("nan")}, 1.0)
    sink.close()
print("STORED", json.dumps(SQLiteStorage.get_logs("grouprl", folder.name)))
print("RUNS", json.dumps(len(SQLiteStorage.get_run_records("grouprl"))))
"""


def test_the_trackio_sink_stores_numbers_and_a_resume_continues_its_run(tmp_path):
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", TRACKIO_SINK, str(tmp_path / "my-run")], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("STORED ", "RUNS ")))
    stored = json.loads(lines["STORED"])
    # text, booleans and NaN ("not measured") are left out; the resumed start adds step 3 to the same run
    assert [{k: v for k, v in row.items() if k != "timestamp"} for row in stored] == [
        {"reward/mean": 0.25, "step": 1}, {"reward/mean": 0.5, "step": 2}, {"reward/mean": 0.75, "step": 3}]
    assert json.loads(lines["RUNS"]) == 1
