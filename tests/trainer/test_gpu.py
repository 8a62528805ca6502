"""A machine with a GPU: ``grouprl train`` in one process trains on it (a process group of one over
NCCL, the model placed by FSDP2 or DDP like a multi-GPU run's), ``dtype: auto`` picks bf16 there, and
(with vLLM's GPU build) rollouts through a colocated vLLM engine that sleeps between rollouts.
Skipped on a machine without CUDA."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grouprl.models import load_policy, tiny_causal_lm
from grouprl.models.precision import resolve_formats
from tests.helpers.trainer import tiny_args

ROOT = Path(__file__).resolve().parents[2]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


def run_train(tmp_path: Path, model: str, *extra: str) -> tuple[str, list[dict]]:
    cmd = [sys.executable, "-m", "grouprl", "--debug", "train",
           *tiny_args(tmp_path, "--model", model, "--max_new_tokens", "8", "--lr", "1e-2", "--save_every", "2", *extra)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return done.stdout, records


def trained_weights_moved(tmp_path: Path, start: torch.nn.Module) -> float:
    """Largest change of any weight between ``start`` and the run's gathered model."""
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    end, _ = load_policy(str(Path(summary["checkpoint"]) / "model"))
    before, after = start.state_dict(), end.state_dict()
    return max((after[k].float() - before[k].float()).abs().max().item() for k in before if k in after)


@needs_gpu
def test_auto_precision_on_a_gpu_is_bf16_where_the_card_has_it():
    got = resolve_formats("auto", "auto", "auto", device=torch.device("cuda"))
    want = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    assert (got.rollout, got.train, got.reference) == (want, want, want)
    assert got.rule == ("gpu-bf16" if want == "bf16" else "gpu") and torch.cuda.get_device_name() in got.reason


@needs_gpu
@pytest.mark.parametrize("engine", ["fsdp", "ddp"])
def test_one_process_trains_on_the_gpu(tmp_path, engine):
    stdout, records = run_train(tmp_path, "tiny", "--engine", engine, "--rollout_engine", "hf")
    assert torch.cuda.get_device_name() in stdout  # the precision line: chosen for the GPU the run trained on
    steps = [r for r in records if "loss/total" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["loss/total"])) for r in steps)
    assert trained_weights_moved(tmp_path, tiny_causal_lm(seed=0)[0]) > 0


@needs_gpu
@needs_vllm
def test_one_process_on_the_gpu_rolls_out_through_vllm(tmp_path):
    """The whole GPU path: FSDP2 on the GPU, the shards gathered into vLLM's in-place reload after
    each step, the engine asleep during the update; the weights pushed are the trained ones."""
    model, tok = tiny_causal_lm(seed=0, hidden_size=128, num_heads=2, num_kv_heads=2)  # head size 64
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    stdout, records = run_train(tmp_path, str(tmp_path / "model"), "--rollout_engine", "vllm")
    assert "rollout_engine: vllm" in stdout
    steps = [r for r in records if "loss/total" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("rollout/mismatch_kl" in r and r["rollout/mismatch_kl"] < 0.05 for r in steps)
    assert steps[1]["time/weight_push"] > 0
    assert trained_weights_moved(tmp_path, model) > 0
