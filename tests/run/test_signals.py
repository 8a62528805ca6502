"""SIGTERM ends a run like Ctrl-C: a message, exit status 128 + 15, the folder released, and a checkpoint
of the last whole step when it can be written within the grace period."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grouprl.errors import Interrupted
from grouprl.run.checkpoint_files import latest_complete, verify_checkpoint
from grouprl.run.folder import LOCK
from grouprl.run.signals import StopOnSignal, interrupts

ROOT = Path(__file__).resolve().parents[2]


def test_the_first_signal_asks_for_a_stop_and_the_loop_end_saves_and_raises():
    stop = StopOnSignal(save=True, grace_s=30.0).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signum == signal.SIGTERM  # nothing raised: the step goes on
        saved, said = [], []
        with pytest.raises(Interrupted) as caught:
            stop.finish(True, lambda: saved.append(7) or "step-000007", 7, said.append)
        assert caught.value.signum == signal.SIGTERM and saved == [7] and said[0].startswith("grouprl: SIGTERM: saved")
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_without_save_on_signal_or_before_a_step_nothing_is_saved():
    for save, step in ((False, 5), (True, 0)):
        stop = StopOnSignal(save=save)
        with pytest.raises(Interrupted):
            stop.finish(True, lambda: pytest.fail("saved"), step, None)
    StopOnSignal(save=True).finish(False, lambda: pytest.fail("saved"), 5, None)  # no signal: the loop goes on


def test_a_second_signal_or_the_end_of_the_grace_period_stops_at_once():
    stop = StopOnSignal(save=True, grace_s=30.0).install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(Interrupted, match="SIGINT received again"):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.uninstall()
    stop = StopOnSignal(save=True, grace_s=0.2).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(Interrupted, match="did not end within 0.2 s"):
            while True:  # a step that would take too long
                time.sleep(0.01)
    finally:
        stop.uninstall()


def test_while_a_folder_is_held_sigterm_raises_like_ctrl_c():
    with interrupts(), pytest.raises(Interrupted) as caught:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert caught.value.signum == signal.SIGTERM


def train(tmp_path: Path, *extra: str) -> subprocess.Popen:
    args = ["--model", "tiny", "--reward_functions", "grouprl.cli.demo:digit_share", "--prompts_per_step", "2",
            "--group_size", "4", "--max_new_tokens", "4", "--total_steps", "100000", "--eval_size", "0",
            "--train_size", "16", "--no-progress", "--num_threads", "1", "--output_dir", str(tmp_path / "run"),
            *extra]
    return subprocess.Popen([sys.executable, "-m", "grouprl", "train", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_step(proc: subprocess.Popen, log: Path, step: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists():
            steps = [json.loads(line).get("step", 0) for line in log.read_text().splitlines() if line.endswith("}")]
            if steps and max(steps) >= step:
                return
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the run never logged step {step}: {proc.communicate()[1][-2000:]}")


@pytest.mark.slow
def test_sigterm_saves_the_last_step_says_interrupted_and_releases_the_folder(tmp_path):
    proc = train(tmp_path)
    wait_for_step(proc, tmp_path / "run" / "metrics.jsonl", 2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "interrupted (SIGTERM received); checkpoints and logs written so far are kept" in err
    saved = latest_complete(tmp_path / "run" / "checkpoints")
    assert saved is not None and int(saved.name.split("-")[1]) >= 2, err[-2000:]
    verify_checkpoint(saved)
    logged = max(json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    assert int(saved.name.split("-")[1]) == logged  # the checkpoint is of the last step the log holds
    assert not (tmp_path / "run" / LOCK).exists()


@pytest.mark.slow
def test_sigterm_without_save_on_signal_keeps_only_what_was_there(tmp_path):
    proc = train(tmp_path, "--save_on_signal", "false")
    wait_for_step(proc, tmp_path / "run" / "metrics.jsonl", 1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert latest_complete(tmp_path / "run" / "checkpoints") is None
    assert not (tmp_path / "run" / LOCK).exists()
