"""`grouprl train --nproc N`: the checks made before any process starts, the torchrun command it
runs, and (slow) a whole 2-process run from the command line."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from grouprl.cli import main
from grouprl.cli.launch import one_gpu_problem, torchrun_command
from grouprl.config import TrainConfig, load_config
from grouprl.report.data import read_jsonl
from tests.helpers.trainer import tiny_args
from tests.helpers.vllm import needs_vllm

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("extra, message", [
    (("--prompts_per_step", "3"), "prompts_per_step=3 .* must divide evenly over 2 processes"),
    (("--dynamic_sampling", "true"), "dynamic_sampling is not available with several processes"),
    (("--algo", "ppo"), "trains a critic, which the process group neither shards nor moves; train it in one"),
])
def test_nproc_refuses_a_batch_it_cannot_split_before_starting_processes(tmp_path, capsys, extra, message):
    code = main(["train", *tiny_args(tmp_path, *extra), "--nproc", "2"])
    err = capsys.readouterr().err
    assert code == 2 and re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_the_processes_train_on_the_resolved_config(tmp_path):
    cmd = torchrun_command(4, tmp_path / "c.yaml")
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"]
    assert cmd[5:] == ["-m", "grouprl", "train", "--config", str(tmp_path / "c.yaml")]


@pytest.mark.slow
def test_train_nproc_2_from_the_command_line(tmp_path):
    """Two processes end to end: one run folder written by the first process, a sharded checkpoint
    plus a gathered model, and the same closing lines as a one-process run."""
    cmd = [sys.executable, "-m", "grouprl", "train", *tiny_args(tmp_path), "--nproc", "2"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("accuracy before=")
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss/total" in r] == [1, 2]
    assert records[1]["rollout/groups"] == 2.0  # the whole batch, gathered from both processes
    assert len(read_jsonl(run / "completions.jsonl")) == 2 * 8
    final = run / "checkpoints" / "step-000002"
    assert (final / "dcp").is_dir() and (final / "model" / "model.safetensors").exists()
    assert sorted(p.name for p in (final / "rng").iterdir()) == ["rank-0.pt", "rank-1.pt"]
    assert (run / "report" / "report.html").exists()
    config = load_config(TrainConfig, run / "config.yaml")
    assert config.prompts_per_step == 2 and config.model == "tiny"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_train_nproc_2_through_vllm_on_the_cpu(tmp_path):
    """Two processes, FSDP, a vLLM engine in each (the head size vLLM's CPU build takes): the gathered
    shards reach both engines before every rollout, and the weights move."""
    from grouprl.models import load_policy, tiny_causal_lm

    start, tok = tiny_causal_lm(seed=0, hidden_size=128, num_heads=2, num_kv_heads=2)  # head size 64
    start.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cmd = [sys.executable, "-m", "grouprl", "train", *tiny_args(tmp_path, "--model", str(tmp_path / "model"),
                                                                 "--rollout_engine", "vllm", "--engine", "fsdp"),
           "--nproc", "2"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rollout_engine: vllm" in done.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "rollout/groups" in r]  # a step whose groups all tie has no loss
    assert [r["step"] for r in steps] == [1, 2] and all(r["time/weight_push"] > 0 for r in steps)
    assert all(r["rollout/groups"] == 2.0 for r in steps)  # the whole batch, gathered from both processes
    end, _ = load_policy(str(tmp_path / "run" / "checkpoints" / "step-000002" / "model"))
    before, after = start.state_dict(), end.state_dict()
    assert max((after[k] - before[k]).abs().max().item() for k in before if k in after) > 0


@needs_vllm  # one of the page's commands samples with vLLM, refused by name where it is not installed
def test_the_readme_scaling_out_commands_resolve(tmp_path, monkeypatch, capsys):
    """Every `grouprl train` and `torchrun ... -m grouprl train` line of the docs' scaling-out page, up to its
    first section, resolves its config (nothing is loaded or started)."""
    text = (ROOT / "docs" / "scaling-out.md").read_text()
    section = text[:text.index("\n## ")]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    lines = [shlex.split(line) for block in blocks for line in block.replace("\\\n", " ").splitlines()
             if line and not line.startswith("pip ")]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "run.yaml").write_text("model: tiny\nprompts_per_step: 8\n")
    monkeypatch.chdir(tmp_path)
    assert len(lines) == 4
    for argv in lines:
        args = argv[argv.index("grouprl") + 1:]
        assert args[0] == "train", argv
        assert main([*args, "--print-config"]) == 0, (argv, capsys.readouterr().err)


@pytest.mark.parametrize("algo, why", [("grpo", None), ("rloo", None), ("reinforce", None),
                                       ("ppo", "trains a critic"), ("trpo", "natural-gradient step")])
def test_one_gpu_runs_train_on_the_gpu_except_critics_and_natural_gradients(algo, why):
    got = one_gpu_problem(TrainConfig(algo=algo))
    assert got is None if why is None else why in got
