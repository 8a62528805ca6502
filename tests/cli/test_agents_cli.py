"""Agents from the command line: `grouprl train --env`, `grouprl eval --env`, `grouprl demo --agent`,
the checks an environment config gets before anything loads, and (slow) `--nproc 2` trained like one
process, with and without an environment."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from grouprl.cli import main
from grouprl.report.data import read_jsonl
from tests.helpers.messages import named

ROOT = Path(__file__).resolve().parents[2]
SUCCESS_LINE = re.compile(r"^success before=(\d\.\d{3}) after=(\d\.\d{3})$")


def agent_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["--model", "tiny", "--env", "tests.helpers.agents:DigitTalk", "--prompts_per_step", "2",
            "--group_size", "4", "--max_new_tokens", "4", "--max_turns", "3", "--max_trajectory_tokens", "64",
            "--total_steps", "2", "--lr", "1e-3", "--eval_size", "4", "--eval_samples", "2", "--train_size", "8",
            "--log_completions_every", "1", "--no-progress", "--output_dir", str(tmp_path / "run"),
            *extra]


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_train_an_agent_then_eval_it_as_the_run_did(tmp_path, capsys, monkeypatch, algo):
    monkeypatch.chdir(ROOT)  # tests.helpers.agents imports from the repository root
    code = main(["train", *agent_args(tmp_path, "--algo", algo)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert SUCCESS_LINE.match(out.strip().splitlines()[-1]), out
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    completions = read_jsonl(run / "completions.jsonl")
    assert completions[0]["trajectory"][0]["role"] == "user" and "turns" in completions[0]
    page = (run / "report" / "report.html").read_text()
    assert "Sample trajectories" in page and "turn policy" in page and "turn env" in page
    code = main(["eval", "--config", str(run / "config.yaml"), "--model", str(run)])
    out, err = capsys.readouterr()
    assert code == 0, err
    table = dict(line.split(maxsplit=1) for line in out.splitlines() if line.startswith(("success", "turns")))
    assert float(table["success"]) == pytest.approx(summary["eval_after"]["eval/success"], abs=1e-3)


@pytest.mark.parametrize("extra, message", [
    (("--tools", "python"), "tools apply to an environment's trajectories, but env is not set"),
    (("--advantage", "gigpo"), "advantage=gigpo apply to an environment's trajectories"),
    (("--env", "guess-numbr"), "did you mean 'guess-number'"),
    (("--env", "guess-number", "--dynamic_sampling", "true"), "dynamic_sampling is not available with an env"),
    (("--env", "guess-number", "--env_options", "{max_guesses: 0}"), "could not be made.*max_guesses"),
    (("--env_options", "{high: 4}"), "env_options apply to an environment's trajectories"),
])
def test_environment_configs_are_checked_before_the_model_loads(tmp_path, capsys, extra, message):
    code = main(["train", "--model", "smollm2-135m", "--output_dir", str(tmp_path / "run"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_a_gem_id_without_gem_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gem" else real(name, *a))
    code = main(["train", "--env", "gem:game:GuessTheNumber-v0-easy", "--output_dir", str(tmp_path / "run")])
    assert code == 2 and "pip install 'grouprl[envs]'" in capsys.readouterr().err


def test_demo_agent_settings(capsys):
    code = main(["demo", "--agent", "--total_steps", "3", "--print-config"])
    config = yaml.safe_load(capsys.readouterr().out)
    assert code == 0 and config["env"] == "guess-number" and config["total_steps"] == 3
    assert config["model"] == "smollm2-135m" and config["task"] == ""


@pytest.mark.slow  # a minute of process starts; the default suite checks the same split in-process
@pytest.mark.parametrize("env", [None, "tests.helpers.agents:DigitTalk"])
def test_two_processes_train_like_one_from_the_command_line(tmp_path, env):
    """The same run with --nproc 2 and in one process: the same completions (each row's draws depend on
    its place in the batch, not on the process that draws it), so the same weights after 3 steps. In fp32:
    bf16 passes (what dtype auto picks for training on a CPU with bf16 units) round differently with the
    shape of each pass, which at lr 1e-2 flips a sampled byte within two steps."""
    extra = ["--env", env, "--max_turns", "3", "--max_trajectory_tokens", "64"] if env else \
        ["--reward_functions", "grouprl.cli.demo:digit_share", "--accuracy_fn", "grouprl.cli.demo:only_digits"]
    weights = {}
    for nproc in (1, 2):
        out = tmp_path / f"n{nproc}"
        cmd = [sys.executable, "-m", "grouprl", "train", "--model", "tiny", *extra, "--prompts_per_step", "4",
               "--group_size", "4", "--max_new_tokens", "4", "--total_steps", "3", "--lr", "1e-2", "--eval_size", "0",
               "--train_size", "16", "--dtype", "fp32", "--engine", "ddp", "--log_completions_every", "1",
               "--no-progress", "--output_dir", str(out), "--nproc", str(nproc)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        weights[nproc] = load_file(str(out / "checkpoints" / "step-000003" / "model" / "model.safetensors"))
        weights[f"c{nproc}"] = [r["completion"] for r in read_jsonl(out / "completions.jsonl")]
    assert weights["c1"] == weights["c2"]
    # the tied embedding and LM head are saved once, under either name
    tied = {"lm_head.weight", "model.embed_tokens.weight"}
    assert set(weights[1]) - tied == set(weights[2]) - tied and set(weights[1]) & tied and set(weights[2]) & tied
    for name, value in weights[1].items():
        other = weights[2][name] if name in weights[2] else weights[2][next(iter(tied & set(weights[2])))]
        # 1% of one Adam step at lr 1e-2
        torch.testing.assert_close(other, value, rtol=1e-4, atol=1e-4, msg=named(name))
