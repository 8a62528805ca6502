"""On-policy distillation: the per-token advantage against hand-worked numbers, the trainer's use of a teacher (a
copy of the policy gives no signal; another teacher is approached), and the checks of its keys."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch

from grouprl.algos.distillation import distill_advantages
from grouprl.errors import ConfigError
from grouprl.models import tiny_causal_lm
from grouprl.trainer.teacher import tokenizer_problem
from grouprl.trainer.trainer import Trainer
from tests.helpers.trainer import PROMPTS, base_config, digit_share, params_of

REAL_CLIENT = httpx.Client


def test_a_completions_advantage_spreads_over_its_tokens_and_the_gap_is_added():
    student = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    teacher = torch.tensor([[-2.0, -1.0, -3.0], [-0.5, -1.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    got, metrics = distill_advantages(torch.tensor([0.5, -1.0]), student, teacher, mask, 0.5)
    # row 0: 0.5 + 0.5 * (-1, 1, 0); row 1: -1 + 0.5 * (0, -1), its third token out of the loss
    assert got.tolist() == [[0.0, 1.0, 0.5], [-1.0, -1.5, 0.0]]
    # reverse KL per token: (1 - 1 + 0 + 0 + 1) / 5; the teacher's mean: (-2 - 1 - 3 - 0.5 - 1.5) / 5
    assert metrics["reverse_kl"].item() == pytest.approx(0.2)
    assert metrics["teacher_logp"].item() == pytest.approx(-1.6)


def test_per_token_advantages_take_the_gap_token_by_token_and_no_gradient_flows_into_either_model():
    student = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -1.0]], requires_grad=True)
    got, _ = distill_advantages(torch.tensor([[1.0, 2.0]]), student, teacher, torch.ones(1, 2), 2.0)
    assert got.tolist() == [[0.0, 4.0]]
    assert not got.requires_grad


def digit_teacher(boost: float):
    """The tiny model of seed 0 with its head's logits of the digit tokens raised by ``boost``."""
    model, tok = tiny_causal_lm(seed=0)
    embed = model.get_input_embeddings().weight
    head = torch.nn.Linear(embed.shape[1], embed.shape[0], bias=True)
    head.weight = embed
    bias = torch.zeros(embed.shape[0])
    bias[[i for i in range(len(tok)) if tok.decode([i]).strip().isdigit()]] = boost
    head.bias = torch.nn.Parameter(bias, requires_grad=False)
    model.lm_head = head
    return model, tok


def distilled(tmp_path, boost, steps=2, **overrides) -> tuple[Trainer, list[dict]]:
    torch.manual_seed(0)
    model, tok = tiny_causal_lm(seed=0)
    teacher, teacher_tok = digit_teacher(boost)
    config = base_config(tmp_path, teacher_model="tiny", distill_coef=1.0, total_steps=steps, beta=0.0,
                         eval_every=0, temperature=1.0, **overrides)
    trainer = Trainer(config, policy=model, tokenizer=tok, train_data=PROMPTS, teacher=teacher,
                      teacher_tokenizer=teacher_tok)
    before = params_of(trainer.policy)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    moved = max((p - before[k]).abs().max().item() for k, p in params_of(trainer.policy).items())
    assert moved > 0, "the policy did not move"
    return trainer, [r for r in rows if "distill/reverse_kl" in r]


def test_a_teacher_that_is_the_policy_gives_a_reverse_kl_of_zero(tmp_path):
    # the same weights (seed 0) in fp32: the sampled tokens' log-probs under both agree to float rounding
    _, rows = distilled(tmp_path, boost=0.0, steps=1)
    assert abs(rows[0]["distill/reverse_kl"]) < 1e-4
    assert rows[0]["distill/teacher_logp"] < -1.0  # a random 2-layer model spreads its mass


def test_a_teacher_is_held_in_the_training_format(tmp_path):
    """A teacher loaded in fp32 (as the command line loads any model) is held in bf16 when training runs in bf16:
    half its memory, the same products (autocast computes the teacher's forward in bf16 either way)."""
    model, tok = tiny_causal_lm(seed=0)
    teacher, teacher_tok = tiny_causal_lm(seed=1)
    assert next(teacher.parameters()).dtype == torch.float32
    trainer = Trainer(base_config(tmp_path, teacher_model="tiny", distill_coef=1.0, total_steps=1, dtype="bf16",
                                  eval_every=0), policy=model, tokenizer=tok, train_data=PROMPTS, teacher=teacher,
                      teacher_tokenizer=teacher_tok)
    try:
        assert {p.dtype for p in trainer.teacher.model.parameters()} == {torch.bfloat16}
        trainer.train()
        rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert math.isfinite(next(r for r in rows if "distill/reverse_kl" in r)["distill/reverse_kl"])
    finally:
        trainer.close()


def digit_mass(model, tok) -> float:
    """The probability the model gives the digit tokens right after each of 8 training prompts, averaged."""
    ids = [i for i in range(len(tok)) if tok.decode([i]).strip().isdigit()]
    enc = tok([p["prompt"] for p in PROMPTS[:8]], return_tensors="pt", padding=True)
    with torch.no_grad():
        return float(model(**enc).logits[:, -1].float().softmax(-1)[:, ids].sum(-1).mean())


def test_distilling_alone_without_a_reward_function_approaches_the_teacher(tmp_path):
    # a teacher that favours the digits e^3 = 20x: about half its mass on them, against the student's 0.05
    teacher, tok = digit_teacher(3.0)
    start = digit_mass(tiny_causal_lm(seed=0)[0], tok)
    assert digit_mass(teacher, tok) > 0.4 and start < 0.1
    trainer, rows = distilled(tmp_path, boost=3.0, steps=12, lr=3e-2)
    assert rows[0]["reward/mean"] == 0.0  # no task reward: the teacher's signal is the only one
    assert all(math.isfinite(r["distill/reverse_kl"]) and r["distill/teacher_logp"] < 0 for r in rows)
    assert len(rows) == 12
    assert digit_mass(trainer.policy, tok) > 0.3  # the student took the teacher's preference


def test_a_teacher_with_another_tokenizer_is_refused_with_both_named():
    _, tok = tiny_causal_lm(seed=0)
    _, other = tiny_causal_lm(seed=0)
    other.add_tokens(["<extra_token>"])
    assert tokenizer_problem(tok, tok, "tiny") is None
    problem = tokenizer_problem(tok, other, "other/model")
    assert "'other/model' has another tokenizer" in problem and "'<extra_token>'" in problem


@pytest.mark.parametrize(("overrides", "message"), [
    ({"distill_coef": 1.0}, "distill_coef > 0 distills from teacher_model"),
    ({"teacher_model": "tiny"}, "is read only with distill_coef > 0"),
    ({"teacher_model": "tiny", "distill_coef": -1.0}, "distill_coef=-1.0 must be >= 0"),
    ({"teacher_model": "tiny", "distill_coef": 1.0, "algo": "ppo"}, "algo=ppo is not one of them"),
])
def test_distillation_keys_that_contradict_are_refused_before_any_model_loads(tmp_path, overrides, message):
    model, tok = tiny_causal_lm(seed=0)
    with pytest.raises(ConfigError, match=message):
        Trainer(base_config(tmp_path, **overrides), policy=model, tokenizer=tok, train_data=PROMPTS,
                reward_fns=[lambda prompts, completions, **_: [0.0] * len(completions)])


def test_with_a_task_reward_the_teachers_gap_adds_to_the_group_advantage(tmp_path):
    # the policy as its own teacher: the gap is float rounding, so each completion's logged advantage (the mean over
    # its tokens) is the task's group advantage, from the same samples as a run without a teacher
    def logged(folder, **overrides):
        torch.manual_seed(0)
        model, tok = tiny_causal_lm(seed=0)
        teacher = dict(teacher=digit_teacher(0.0)[0], teacher_tokenizer=tok) if overrides else {}
        Trainer(base_config(folder, total_steps=1, beta=0.0, eval_every=0, temperature=1.0, **overrides),
                policy=model, tokenizer=tok, train_data=PROMPTS, reward_fns=[digit_share], **teacher).train()
        return [json.loads(line) for line in (folder / "run" / "completions.jsonl").read_text().splitlines()]

    plain, taught = logged(tmp_path / "a"), logged(tmp_path / "b", teacher_model="tiny", distill_coef=1.0)
    assert [r["completion"] for r in plain] == [r["completion"] for r in taught]
    assert any(abs(r["advantage"]) > 0.1 for r in plain)
    for p, t in zip(plain, taught):
        assert t["advantage"] == pytest.approx(p["advantage"], abs=1e-4)


def fake_teacher_server(monkeypatch, answers: dict):
    """``httpx.Client`` answering from ``answers`` (path -> (status, JSON)) instead of a network."""
    import httpx

    def handler(request):
        status, body = answers[request.url.path]
        return httpx.Response(status, json=body)

    monkeypatch.setattr(httpx, "Client", lambda **kw: REAL_CLIENT(transport=httpx.MockTransport(handler), **kw))


def test_a_server_teacher_that_refuses_the_token_or_cuts_text_otherwise_is_named(monkeypatch):
    from grouprl.trainer.teacher import PROBE, ServerTeacher

    _, tok = tiny_causal_lm(seed=0)
    fake_teacher_server(monkeypatch, {"/grouprl/info": (401, {"error": "a bearer token is needed"})})
    with pytest.raises(RuntimeError, match="http://teacher:8000 refused the token"):
        ServerTeacher("http://teacher:8000", "wrong", 5.0, tok)
    other = tok(PROBE, add_special_tokens=False)["input_ids"][::-1]
    fake_teacher_server(monkeypatch, {"/grouprl/info": (200, {}), "/tokenize": (200, {"tokens": other})})
    with pytest.raises(ValueError, match="http://teacher:8000: its tokenizer cuts"):
        ServerTeacher("http://teacher:8000", "t", 5.0, tok)
