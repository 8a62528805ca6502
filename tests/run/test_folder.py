"""The run folder: claimed before any work, never shared by two live runs, never blended with an
earlier run, and nothing in it removed that a run did not write."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from grouprl.cli import main
from grouprl.errors import ConfigError
from grouprl.run.folder import LOCK, RUN_CONFIG_HEADER, FolderLock, claim_output_dir


def tiny(out, *extra):
    return ["train", "--model", "tiny", "--task", "arithmetic", "--reward_functions", "grouprl.cli.demo:digit_share",
            "--prompts_per_step", "2", "--group_size", "2", "--max_new_tokens", "4", "--total_steps", "1",
            "--eval_size", "0", "--no-progress", "--output_dir", str(out), *extra]


def test_a_folder_in_use_by_a_live_process_is_refused(tmp_path, capsys):
    lock = FolderLock(tmp_path).acquire(print)  # this test's own process holds it
    try:
        assert main(tiny(tmp_path)) == 2
        assert f"in use by process {os.getpid()}" in capsys.readouterr().err
    finally:
        lock.release()


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / LOCK).write_text(json.dumps({"pid": int(dead), "host": os.uname().nodename}))
    notes = []
    lock, _ = claim_output_dir(tmp_path, echo=notes.append)
    lock.release()
    assert "left by a process that is gone" in notes[0] and not (tmp_path / LOCK).exists()


def test_overwrite_removes_only_what_a_run_wrote_and_refuses_a_folder_with_other_files(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(tiny(out)) == 0
    for extra in ("checkpoints/other_model.bin", "report/paper.tex", "notes.txt"):
        (out / extra).write_text("mine")
        assert main(tiny(out, "--overwrite")) == 2
        assert "holds files that are not a run's" in capsys.readouterr().err and (out / extra).read_text() == "mine"
        (out / extra).unlink()
    assert main(tiny(out, "--overwrite")) == 0 and (out / "metrics.jsonl").exists()


def test_a_users_config_yaml_is_never_replaced(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("model: tiny\n# my notes\n")
    with pytest.raises(ConfigError, match=r"not a run's \(config.yaml\)"):
        claim_output_dir(tmp_path)
    assert main(tiny(tmp_path, "--overwrite")) == 2
    assert (tmp_path / "config.yaml").read_text() == "model: tiny\n# my notes\n"
    other = tmp_path / "fresh"
    assert main(tiny(other)) == 0
    assert (other / "config.yaml").read_text().startswith(RUN_CONFIG_HEADER)  # a run's own is marked


def test_a_start_refused_before_writing_leaves_no_folder(tmp_path, capsys):
    assert main(tiny(tmp_path / "run", "--lr", "-1")) == 2
    assert not (tmp_path / "run").exists()


def test_a_lock_whose_pid_was_reused_by_another_process_is_taken_over(tmp_path):
    (tmp_path / LOCK).write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "started": 1}))
    notes = []
    lock, _ = claim_output_dir(tmp_path, echo=notes.append)  # this pid is alive, but it started later
    lock.release()
    assert "left by a process that is gone" in notes[0]


def test_stray_temporary_files_of_a_killed_run_are_cleared_when_the_folder_is_claimed(tmp_path):
    for name in (".summary.json.x1.tmp", ".config.yaml.x2.tmp"):
        (tmp_path / name).write_text("half")
    lock, _ = claim_output_dir(tmp_path)
    lock.release()
    assert sorted(os.listdir(tmp_path)) == []


def test_a_start_that_failed_at_its_first_rollout_leaves_a_folder_the_corrected_command_takes(tmp_path, capsys):
    """A run whose first step failed (here its reward function raises) wrote its config and logs but
    trained nothing: the corrected command, and --resume_from latest, start afresh in that folder."""
    out = tmp_path / "run"
    broken = tiny(out, "--reward_functions", "tests.helpers.trainer:raises_on_every_batch")
    assert main(broken) != 0
    assert (out / "config.yaml").exists()  # the failed start did write into the folder
    assert main(tiny(out)) == 0
    assert "never trained a step; starting afresh" in capsys.readouterr().out
    assert (out / "checkpoints" / "step-000001").is_dir()
    assert main(broken) != 0  # the folder now holds a run: resuming it is the way on
    out2 = tmp_path / "run2"
    assert main(tiny(out2, "--reward_functions", "tests.helpers.trainer:raises_on_every_batch")) != 0
    assert main(tiny(out2, "--resume_from", "latest")) == 0
    assert "nothing to resume" in capsys.readouterr().out
