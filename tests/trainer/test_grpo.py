import json
import math
import re
from pathlib import Path

import pytest
import torch

import grouprl.trainer.policy as policy_module
from grouprl.algos import AGGREGATIONS, group_advantages
from grouprl.models import tiny_causal_lm
from grouprl.report.data import read_jsonl
from grouprl.rewards import RewardFunctionError
from grouprl.rollout.logprobs import token_logprobs
from grouprl.run.checkpoint_files import checkpoint_dirs
from grouprl.run.logs import PhaseTimer
from grouprl.trainer.trainer import Trainer
from tests.helpers.trainer import (
    PROMPTS,
    base_config,
    digit_share,
    make_trainer,
    params_of,
    rollout,
    update_grads,
)

REQUIRED_METRICS = [
    "reward/mean", "reward/std", "reward/digit_share", "rollout/zero_std_frac", "rollout/len_mean",
    "rollout/len_max", "rollout/truncated_frac", "policy/kl", "policy/clip_low", "policy/clip_high",
    "policy/entropy", "loss/total", "loss/policy", "loss/kl", "optim/grad_norm", "optim/lr", "time/rollout",
    "time/reward", "time/logprobs", "time/update", "time/step", "throughput/tokens_per_s", "memory/peak_rss_mb",
]


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_micro_batches_give_the_same_update_as_one_batch(tmp_path, mode):
    """B rows in one pass vs micro-batches of 3 with accumulation: same gradient, same parameters."""
    results = []
    for micro in (8, 3):
        trainer = make_trainer(tmp_path / str(micro), aggregation=mode, micro_batch_size=micro, beta=0.1,
                               entropy_coef=0.01)
        batch, rewards = rollout(trainer)
        ref_logp = trainer.passes.reference_logprobs(batch)
        adv = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.2, 0.3, 0.3, 0.9, 0.0]), 4)
        grads = update_grads(trainer, batch, adv, ref_logp=ref_logp)
        results.append((grads, params_of(trainer.policy)))
    (g1, p1), (g2, p2) = results
    for k in g1:
        torch.testing.assert_close(g2[k], g1[k], atol=1e-6, rtol=1e-4)
        # Adam's first step is ~lr * g / |g|: where |g| is near Adam's eps, fp32 summation-order noise
        # in g shows up amplified, so the parameters are compared at 1% of the step size (lr = 1e-3).
        torch.testing.assert_close(p2[k], p1[k], atol=1e-5, rtol=0)


def test_on_policy_gradient_is_reinforce(tmp_path):
    trainer = make_trainer(tmp_path, beta=0.0, max_grad_norm=0.0)
    batch, _ = rollout(trainer)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0])
    got = update_grads(trainer, batch, adv)

    fresh = make_trainer(tmp_path / "fresh", beta=0.0)
    fresh.policy.train()
    logp, _ = token_logprobs(fresh.policy, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                             batch.completion_mask)
    m = batch.completion_mask
    # REINFORCE: -(1/B) sum_i (1/|o_i|) sum_t A_i log pi(o_it)
    loss = -((adv.unsqueeze(-1) * logp * m).sum(-1) / m.sum(-1)).mean()
    loss.backward()
    for k, p in fresh.policy.named_parameters():
        torch.testing.assert_close(got[k], p.grad, atol=1e-6, rtol=1e-4)


def test_rows_outside_the_loss_get_no_pass_and_leave_the_gradient_exact(tmp_path, monkeypatch):
    """A dropped all-equal group's rows are not run through the policy, and the gradient is still the
    formula's over the rows that are in the loss."""
    trainer = make_trainer(tmp_path, beta=0.0, max_grad_norm=0.0, micro_batch_size=3)
    batch, _ = rollout(trainer)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0])
    mask = batch.completion_mask.clone()
    mask[4:] = 0  # the second group left out of the loss, as zero_std_groups=drop does
    seen, logprobs = [], trainer.passes.logprobs
    monkeypatch.setattr(trainer.passes, "logprobs", lambda model, rollout, rows, **kw: (
        seen.extend(rows.tolist()), logprobs(model, rollout, rows, **kw))[1])
    got = update_grads(trainer, batch, adv, mask=mask)
    assert sorted(seen) == [0, 1, 2, 3]

    fresh = make_trainer(tmp_path / "fresh", beta=0.0)
    fresh.policy.train()
    logp, _ = token_logprobs(fresh.policy, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                             batch.completion_mask)
    # seq-mean-token-mean over the 4 rows in the loss: -(1/4) sum_i (1/|o_i|) sum_t A_i log pi(o_it)
    loss = -((adv.unsqueeze(-1) * logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / 4
    loss.backward()
    for k, p in fresh.policy.named_parameters():
        torch.testing.assert_close(got[k], p.grad, atol=1e-6, rtol=1e-4)


def one_group_all_equal(prompts, completions, **_):
    """The first group's 4 rewards all equal, the second's not (B = 8, prompt-major)."""
    return [1.0] * 4 + [0.0, 1.0, 0.0, 1.0]


def test_log_prob_passes_skip_dropped_groups_and_the_step_is_unchanged(tmp_path, monkeypatch):
    """Under drop, the old and reference passes run only on rows left in the loss; the step's
    parameters equal those of a step that ran them on every row."""
    settings = dict(reward_fns=(one_group_all_equal,), zero_std_groups="drop", beta=0.1, mu=2, total_steps=1,
                    micro_batch_size=2)
    trainer = make_trainer(tmp_path / "live", **settings)
    seen, logprobs = [], trainer.passes.logprobs

    def spy(model, batch, rows=None, **kw):
        if rows is None:
            only = kw.get("only")
            seen.append(list(range(batch.batch_size)) if only is None else only.nonzero().flatten().tolist())
        return logprobs(model, batch, rows, **kw)

    monkeypatch.setattr(trainer.passes, "logprobs", spy)
    metrics, _ = trainer.step()
    assert seen == [[4, 5, 6, 7], [4, 5, 6, 7]]  # pi_old, then pi_ref
    assert metrics["rollout/zero_std_frac"] == 0.5

    every = make_trainer(tmp_path / "every", **settings)
    monkeypatch.setattr(every.baseline, "rows_in_loss", lambda got, mask: None)
    reference, _ = every.step()
    for k, v in params_of(trainer.policy).items():
        torch.testing.assert_close(v, params_of(every.policy)[k], atol=1e-6, rtol=1e-5)
    for k in ("policy/kl", "policy/kl_sequence", "loss/total"):
        assert metrics[k] == pytest.approx(reference[k], rel=1e-5, abs=1e-7), k


def test_old_and_reference_logprobs_only_when_needed(tmp_path, monkeypatch):
    calls = {"no_grad": 0}
    real = policy_module.token_logprobs

    def counting(*args, **kwargs):
        if not torch.is_grad_enabled():
            calls["no_grad"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(policy_module, "token_logprobs", counting)
    # micro_batch_size 8 = B: one no-grad pass per extra log-prob computation
    for kwargs, expected in [({"beta": 0.0}, 0), ({"beta": 0.1}, 1), ({"beta": 0.0, "mu": 2}, 1),
                             ({"beta": 0.1, "minibatch_size": 4}, 2)]:
        calls["no_grad"] = 0
        trainer = make_trainer(tmp_path / str(len(kwargs)) / str(expected), total_steps=1, **kwargs)
        trainer.step()
        assert calls["no_grad"] == expected, kwargs
        assert (trainer.reference is None) == (kwargs["beta"] == 0.0)


def test_smoke_tiny_model_learns_a_learnable_reward(tmp_path):
    trainer = make_trainer(tmp_path, prompts_per_step=4, group_size=8, max_new_tokens=8, total_steps=30, lr=3e-3,
                           beta=0.0, eval_every=0, log_completions_every=0)
    before = params_of(trainer.policy)
    trainer.train()
    rewards = [r["reward/mean"] for r in trainer.metrics_log.records() if "reward/mean" in r]
    assert len(rewards) == 30
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.2, (first, last)
    after = params_of(trainer.policy)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_run_folder_metrics_and_completions(tmp_path):
    trainer = make_trainer(tmp_path, total_steps=2, eval_every=1)
    summary = trainer.train()
    out = Path(trainer.config.output_dir)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if "reward/mean" in r]
    assert [r["step"] for r in train_records] == [1, 2]
    for key in REQUIRED_METRICS:
        assert key in train_records[0], key
    evals = [r for r in records if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert "eval/pass@4" in evals[0] and 0 <= evals[0]["eval/accuracy"] <= 1
    completions = read_jsonl(out / "completions.jsonl")
    assert len(completions) == 2 * 8 and set(completions[0]) >= {"step", "prompt", "completion", "reward", "rewards"}
    assert (out / "config.yaml").exists() and (out / "summary.json").exists()
    assert summary["eval_before"]["eval/accuracy"] == evals[0]["eval/accuracy"]
    assert checkpoint_dirs(out / "checkpoints")[-1].name == "step-000002"


def test_dynamic_sampling_fills_the_batch_with_informative_groups(tmp_path):
    def only_even_prompts_vary(prompts, completions, **_):
        # prompts "Count: <odd>" always get 1.0 (all-equal groups); even ones vary with the completion
        return [1.0 if int(p.split()[-1]) % 2 else float(len(c) % 2) for p, c in zip(prompts, completions)]

    trainer = make_trainer(tmp_path, reward_fns=[only_even_prompts_vary], dynamic_sampling=True,
                           dynamic_sampling_max_rounds=6, prompts_per_step=4)
    metrics, _ = trainer.step()
    assert metrics["rollout/zero_std_frac"] == 0.0
    assert metrics["rollout/groups"] == 4.0
    assert metrics["rollout/rounds"] >= 2.0


def test_zero_std_groups_drop_removes_their_kl(tmp_path):
    def constant(prompts, completions, **_):
        return [1.0] * len(completions)

    results = {}
    for policy in ("keep", "drop"):
        trainer = make_trainer(tmp_path / policy, reward_fns=[constant], beta=0.5, zero_std_groups=policy)
        with torch.no_grad():  # move the policy away from the reference so the KL term has a gradient
            for p in trainer.policy.parameters():
                p.add_(0.05 * torch.randn_like(p))
        before = params_of(trainer.policy)
        metrics, _ = trainer.step()
        moved = any(not torch.equal(before[k], v) for k, v in params_of(trainer.policy).items())
        results[policy] = (metrics, moved)
    keep, keep_moved = results["keep"]
    drop, drop_moved = results["drop"]
    assert keep["rollout/zero_std_frac"] == 1.0 and keep["policy/kl"] > 0 and keep_moved
    assert drop.get("optim/skipped", 0) > 0 and "policy/kl" not in drop and not drop_moved


def test_reward_function_error_names_function_and_row(tmp_path):
    def broken(prompts, completions, **_):
        raise RuntimeError("boom")

    trainer = make_trainer(tmp_path, reward_fns=[broken])
    with pytest.raises(RewardFunctionError, match="broken"):
        trainer.train()
    assert checkpoint_dirs(Path(trainer.config.output_dir) / "checkpoints") == []


def test_prompt_too_long_is_rejected_before_any_generation(tmp_path):
    with pytest.raises(ValueError, match="train row 0: the prompt is .* over max_prompt_len=4"):
        make_trainer(tmp_path, max_prompt_len=4)


def test_lora_trains_adapters_only_and_reference_is_the_base(tmp_path):
    trainer = make_trainer(tmp_path, lora_rank=4, lora_alpha=8.0, lr=1e-2, beta=0.1, total_steps=3)
    assert trainer.reference is None
    base_before = {k: v.clone() for k, v in trainer.policy.named_parameters() if "lora_" not in k}
    lora_before = {k: v.clone() for k, v in trainer.policy.named_parameters() if "lora_" in k}
    for _ in range(3):
        metrics, _ = trainer.step()
        trainer.step_count += 1
    for k, v in trainer.policy.named_parameters():
        if "lora_" in k:
            continue
        assert torch.equal(v, base_before[k]), k
    assert any(not torch.equal(v, lora_before[k]) for k, v in trainer.policy.named_parameters() if "lora_" in k)
    assert metrics["policy/kl"] > 0  # adapters moved the policy away from the adapter-free base


def test_lora_adapters_start_from_the_runs_seed(tmp_path):
    def adapters(seed, caller_seed):
        model, tok = tiny_causal_lm(seed=0)
        torch.manual_seed(caller_seed)  # whatever the caller's generator holds
        trainer = Trainer(base_config(tmp_path / f"{seed}-{caller_seed}", lora_rank=4, seed=seed), policy=model,
                          tokenizer=tok, reward_fns=[digit_share], train_data=PROMPTS)
        return {k: v.clone() for k, v in trainer.policy.named_parameters() if "lora_A" in k}

    state = torch.random.get_rng_state()
    first, again, other = adapters(0, caller_seed=1), adapters(0, caller_seed=2), adapters(1, caller_seed=1)
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)
    torch.random.set_rng_state(state)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_lora_run_in_bf16_stores_its_frozen_base_in_bf16_and_trains(tmp_path, dtype):
    trainer = make_trainer(tmp_path, dtype=dtype, lora_rank=4, lr=1e-2, beta=0.1, total_steps=2)
    embedding = trainer.policy.get_input_embeddings().weight
    base = [m.weight for m in trainer.policy.modules()
            if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad and m.weight is not embedding]
    assert base and all(w.dtype == (torch.bfloat16 if dtype == "bf16" else torch.float32) for w in base)
    assert embedding.dtype == torch.float32
    lora_before = {k: v.clone() for k, v in trainer.policy.named_parameters() if "lora_" in k}
    for _ in range(2):
        metrics, _ = trainer.step()
        trainer.step_count += 1
    assert any(not torch.equal(v, lora_before[k]) for k, v in trainer.policy.named_parameters() if "lora_" in k)
    assert math.isfinite(metrics["policy/kl"]) and metrics["policy/kl"] > 0  # the adapters moved the policy


def test_reference_sync_copies_the_policy(tmp_path):
    trainer = make_trainer(tmp_path, beta=0.1, ref_sync_steps=1, lr=1e-2)
    trainer.step()
    for r, p in zip(trainer.reference.parameters(), trainer.policy.parameters()):
        assert torch.equal(r, p)


def test_kl_in_reward_moves_rewards_not_loss(tmp_path):
    trainer = make_trainer(tmp_path, beta=0.5, kl_in_reward=True, lr=1e-2)
    trainer.step()
    trainer.step_count += 1
    metrics, samples = trainer.step()
    assert "loss/kl" not in metrics
    raw = digit_share([s["prompt"] for s in samples], [s["completion"] for s in samples])
    shaped = [s["reward"] for s in samples]
    assert all(s <= r + 1e-6 for s, r in zip(shaped, raw)) and any(s < r - 1e-6 for s, r in zip(shaped, raw))


def test_prompts_are_drawn_in_a_seeded_order_covering_every_row(tmp_path):
    trainer = make_trainer(tmp_path)
    seen = trainer.collector.stream.take(len(PROMPTS))
    assert sorted(seen) == list(range(len(PROMPTS)))


def test_a_prompt_that_leaves_no_room_in_the_models_context_is_named_before_training(tmp_path):
    from grouprl.errors import PromptTooLongError

    with pytest.raises(PromptTooLongError, match="train row 0: .* over the model's context of 512") as caught:
        make_trainer(tmp_path, max_new_tokens=500)  # "Count: 0" and its template are ~30 tokens
    bound = int(re.search(r"lower max_new_tokens to at most (\d+) ", str(caught.value)).group(1))
    assert 400 < bound < 500
    make_trainer(tmp_path / "fits", max_new_tokens=bound)  # the bound named fits every prompt of the set


def test_fewer_rows_than_prompts_per_step_warns_of_copies(tmp_path):
    from grouprl.models import tiny_causal_lm
    from grouprl.trainer.trainer import Trainer
    from tests.helpers.trainer import base_config

    model, tok = tiny_causal_lm(seed=0)
    with pytest.warns(UserWarning, match="1 row.*prompts_per_step is 2: every step trains on copies"):
        Trainer(base_config(tmp_path), policy=model, tokenizer=tok, reward_fns=[digit_share],
                train_data=[{"prompt": "Count: 1"}])


def test_group_by_compares_the_rows_that_share_a_column_across_prompts(tmp_path):
    """group_by: the completions of every prompt with the same ``task`` value form one group (of any
    size), and each advantage is (r - that group's mean) / its std."""
    torch.manual_seed(0)
    model, tok = tiny_causal_lm(seed=0)
    rows = [{"prompt": f"Count: {i}", "task": i % 3} for i in range(12)]

    def digits_and_length(prompts, completions, **_):  # varied rewards: no group is all-equal
        return [sum(ch.isdigit() for ch in c) + len(c) / 10 for c in completions]

    trainer = Trainer(base_config(tmp_path, prompts_per_step=6, group_size=2, group_by="task"), policy=model,
                      tokenizer=tok, reward_fns=[digits_and_length], train_data=rows)
    _, records = trainer.step()
    task = {r["prompt"]: r["task"] for r in rows}
    by_task = {}
    for r in records:
        by_task.setdefault(task[r["prompt"]], []).append(r)
    assert sorted(len(v) for v in by_task.values()) != [2] * 6  # groups span prompts, not one prompt's G
    for members in by_task.values():
        rewards = torch.tensor([m["reward"] for m in members])
        std = rewards.std(unbiased=False)
        expected = (rewards - rewards.mean()) / std if std > 0 else torch.zeros_like(rewards)
        torch.testing.assert_close(torch.tensor([m["advantage"] for m in members]), expected, rtol=1e-4, atol=1e-5)


def test_a_collected_rollout_moves_whole_to_the_training_device(tmp_path):
    """A GPU run moves each step's rollout and rewards to the GPU: every tensor goes, nothing else changes."""
    trainer = make_trainer(tmp_path)
    got = trainer.collector.collect(0, PhaseTimer())
    moved = got.to(torch.device("meta"))
    tensors = [v for v in vars(moved.batch).values() if isinstance(v, torch.Tensor)]
    assert tensors and all(t.device.type == "meta" for t in tensors)
    assert moved.rewards.device.type == "meta" and all(v.device.type == "meta" for v in moved.per_fn.values())
    assert moved.batch.completions == got.batch.completions and moved.rounds == got.rounds
    assert got.rewards.device.type == "cpu"  # the original is left as it was

