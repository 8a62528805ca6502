"""``grouprl train`` says what it is doing as each slow phase starts, on stderr, before the first step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grouprl.cli import main

PHASES = ["grouprl: config resolved: model tiny, task arithmetic",
          "grouprl: loading the prompts and reward functions (task arithmetic)",
          "grouprl: loading the model tiny",
          "grouprl: building the trainer (reference, rollout engine, number formats)",
          "grouprl: training: a held-out evaluation first, then 1 step"]


def one_step(tmp_path: Path) -> list[str]:
    return ["train", "--model", "tiny", "--total_steps", "1", "--reward_functions", "grouprl.cli.demo:digit_share",
            "--prompts_per_step", "2", "--group_size", "2", "--max_new_tokens", "4", "--eval_size", "2",
            "--eval_samples", "1", "--train_size", "4", "--no-progress",
            "--output_dir", str(tmp_path / "run")]


def test_phase_lines_come_in_order_before_the_first_step(tmp_path, capsys, monkeypatch):
    from grouprl.trainer.trainer import Trainer

    step = Trainer.step

    def marked_step(self):  # the first step says so on the same stream, so the order is the stream's
        print("STEP", file=sys.stderr, flush=True)
        return step(self)

    monkeypatch.setattr(Trainer, "step", marked_step)
    assert main(one_step(tmp_path)) == 0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("grouprl: ") or line == "STEP"]
    assert lines == [*PHASES, "STEP"], err
    assert "grouprl: " not in out  # stdout keeps the results: the setup lines, the report, before/after
    assert out.splitlines()[-1].startswith("accuracy before=")


def test_bad_input_is_one_paragraph_without_phase_lines(tmp_path, capsys):
    assert main([*one_step(tmp_path), "--learning_rate", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("grouprl: error: ") and err.count("\n") == 1, err
    assert main([*one_step(tmp_path), "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("model: ")  # only the YAML: nothing was loaded


@pytest.mark.slow
def test_the_command_prints_its_first_line_before_loading_anything(tmp_path):
    """As a user runs it: a subprocess whose stdout and stderr share one pipe, unbuffered."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "grouprl", *one_step(tmp_path)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    first_phase = lines.index(next(line for line in lines if line.startswith("grouprl: ")))
    assert lines[first_phase] == PHASES[0], lines  # once, also where the command started again
    shown = [line for line in lines if line.startswith("grouprl: ")]
    assert shown == PHASES, shown
    # the trainer's setup lines come after "building the trainer" and before "training"
    assert lines.index(PHASES[3]) < next(i for i, line in enumerate(lines) if line.startswith("rollout_engine:")) \
        < lines.index(PHASES[4])
