"""Every recipe in examples/ resolves with ``--print-config`` as written, and trains for one step on the
CPU with the tiny model, its hub dataset swapped for a local folder in the hub's layout and its GPU-only
settings (vLLM, rollout servers, wandb) swapped for the built-in engine and the metrics file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from grouprl.cli import main
from tests.helpers.hub_layout import write_gsm8k_layout, write_math_layout
from tests.helpers.vllm import HAVE_VLLM

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("**/*.yaml"))
ONE_STEP = ["--model", "tiny", "--total_steps", "1", "--prompts_per_step", "2", "--group_size", "2",
            "--max_new_tokens", "4", "--eval_size", "2", "--eval_samples", "1", "--eval_every", "0", "--save_every",
            "0", "--dtype", "fp32", "--rollout_engine", "hf", "--loggers", "jsonl", "--no-progress"]
"""What every one-step run sets: the tiny model, the smallest batch, fp32 on the built-in engine, no wandb."""
LOCAL = {
    "examples/gsm8k-qwen.yaml": lambda tmp: ["--dataset", write_gsm8k_layout(tmp / "gsm8k")],
    "examples/math-lora.yaml": lambda tmp: ["--dataset", write_math_layout(tmp / "math")],
    "examples/agent-tools/run.yaml": lambda tmp: ["--model", long_context_tiny(tmp / "tiny"), "--rollout_servers",
                                                  "none", "--max_staleness", "0", "--max_turns", "2",
                                                  "--train_size", "4"],
    "examples/openai-agent/run.yaml": lambda tmp: ["--model", long_context_tiny(tmp / "tiny")],
    "examples/arithmetic.yaml": lambda tmp: ["--train_size", "4"],
    "examples/countdown-lora.yaml": lambda tmp: ["--train_size", "4"],
}
"""Per recipe, what replaces what the CPU here cannot reach (the hub, a running server) or need."""


def long_context_tiny(folder: Path) -> Path:
    """The tiny model with a context of 2048 tokens, saved: the tool's schema in the system prompt is over
    a thousand of its byte tokens, more than the 512 of ``--model tiny``."""
    from grouprl.models import tiny_causal_lm

    model, tokenizer = tiny_causal_lm(max_positions=2048)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_every_recipe_is_covered():
    assert EXAMPLES and set(LOCAL) | {"examples/dataset/run.yaml"} == set(EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES)
def test_the_recipe_resolves_and_its_command_comes_first(path, monkeypatch, capsys):
    if "rollout_engine: vllm" in (ROOT / path).read_text() and not HAVE_VLLM:
        pytest.skip("a vLLM recipe is refused by name where vLLM is not installed")
    monkeypatch.chdir(ROOT)  # the recipes' paths are relative to the repository root
    assert main(["train", "--config", path, "--print-config"]) == 0, capsys.readouterr().err
    resolved = yaml.safe_load(capsys.readouterr().out)
    written = yaml.safe_load((ROOT / path).read_text())
    assert {k: resolved[k] for k in written} == {k: _as_resolved(v) for k, v in written.items()}
    head = (ROOT / path).read_text().split("\n\n")[0]
    assert f"grouprl train --config {path}" in head  # the exact command, in the opening comment


def _as_resolved(value):
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("path", EXAMPLES)
def test_the_recipe_trains_one_step_on_the_cpu(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    extra = [str(a) for a in LOCAL.get(path, lambda tmp: [])(tmp_path)]
    run = tmp_path / "run"
    code = main(["train", "--config", path, *ONE_STEP, *extra, "--output_dir", str(run)])
    assert code == 0, capsys.readouterr().err
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if "reward/mean" in m] == [1]
    after = json.loads((run / "summary.json").read_text())["eval_after"]
    # an environment's, the agent's own reward, else the checker's
    held_out = {"agent-tools": "eval/success", "openai-agent": "eval/mean_reward"}.get(path.split("/")[1],
                                                                                       "eval/accuracy")
    assert 0.0 <= after[held_out] <= 1.0


def test_the_agent_recipe_environment_agrees_with_its_tool():
    from grouprl.registry import import_object

    quiz = import_object("examples/agent-tools/env.py:UnitQuiz", "env")()
    convert = import_object("examples/agent-tools/tools.py:convert_units", "tool")
    for seed in range(40):  # every question kind comes up
        opening, _ = quiz.reset(seed=seed)
        example_call = json.loads(re.fullmatch("<tool_call>(.*)</tool_call>", opening[1]["content"]).group(1))
        assert convert(**example_call["arguments"]) == opening[2]["content"] == opening[3]["content"]
        question = opening[-1]["content"]
        value, source, target = re.fullmatch(r"How many (\w+) is ([\d.]+) (\w+)\?.*", question, re.S).group(2, 3, 1)
        tool_says = convert(float(value), source, target)
        assert quiz.step(f"It is {tool_says}.")[1:4] == (1.0, True, False), (question, tool_says)
        assert quiz.step(f"It is {float(tool_says) * 1.05:.6g}.")[1] == 0.0
    with pytest.raises(ValueError, match="cannot convert length .mi. to mass .kg."):
        convert(1, "mi", "kg")
    with pytest.raises(ValueError, match="unknown unit 'furlong'"):
        convert(1, "furlong", "m")
