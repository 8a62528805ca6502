"""The rollout importance-sampling correction inside the GRPO trainer: which tensors it uses,
what reaches the update, and what is logged."""

import pytest
import torch

from grouprl.algos.rollout_correction import truncated_is_weights
from grouprl.rollout.cpu import bf16_weights
from tests.helpers.trainer import make_trainer


def _capture_update(trainer, monkeypatch):
    seen = {}
    real = trainer.rule.update

    def update(data, step, beta):
        seen.update(batch=data.rollout, advantages=data.advantages, old_logp=data.old_logp, mask=data.mask)
        return real(data, step, beta)

    monkeypatch.setattr(trainer.rule, "update", update)
    return seen


def _old_policy_pass(monkeypatch):
    """Make the trainer take pi_old from a pass of its own before the update, as off-policy."""
    from grouprl.trainer.config import TrainerConfig

    monkeypatch.setattr(TrainerConfig, "rollout_is_in_update", property(lambda self: False))


BF16_ROLLOUTS_FP32_TRAINING = {"dtype": "fp32", "rollout_dtype": "bf16"}


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_the_update_gets_advantages_weighted_by_the_capped_ratio(tmp_path, monkeypatch, level):
    # bf16 rollouts against an fp32 trainer: a real, small engine/trainer mismatch
    _old_policy_pass(monkeypatch)
    trainer = make_trainer(tmp_path, rollout_is=level, rollout_is_cap=1.001, dtype="bf16")
    seen = _capture_update(trainer, monkeypatch)
    metrics, records = trainer.step()
    batch, old_logp, mask = seen["batch"], seen["old_logp"], seen["mask"]
    assert old_logp is not None
    weights, _ = truncated_is_weights(old_logp, batch.sampling_logprobs, mask, level=level, cap=1.001)
    row_advantages = torch.tensor([r["advantage"] for r in records])
    torch.testing.assert_close(seen["advantages"], row_advantages.unsqueeze(-1) * weights)
    cap = 1.001 + 1e-6  # up to float32 rounding
    assert metrics["rollout/mismatch_kl"] > 0 and 0 < metrics["rollout/is_weight_mean"] <= cap
    assert 0 <= metrics["rollout/is_capped_frac"] <= 1


EPS32 = torch.finfo(torch.float32).eps


def _gradients_of_each_step(trainer) -> list[dict[str, torch.Tensor]]:
    """The policy's gradients as each optimizer step takes them (after clipping), appended as the steps run."""
    taken = []
    trainer.rule.optimizer.register_step_pre_hook(lambda *_: taken.append(
        {k: p.grad.clone() for k, p in trainer.policy.named_parameters()}))
    return taken


def _assert_same_first_adam_step(name, before, a, b, grad_a, grad_b, lr, eps, accumulated):
    """Two first AdamW steps (zero moments, no weight decay) from ``before`` on gradients that should differ only
    by float32 rounding of sums of ``accumulated`` terms in another grouping.

    The gradients: |g_a - g_b| <= accumulated * eps32 * max|g| (the classic bound on a float sum, with the
    largest gradient as the size of its terms). The step is u = lr * g / (|g| + eps_adam): its slope in g is
    lr * eps_adam / (|g| + eps_adam)**2, lr / eps_adam = 1e5 at g = 0, so a weight whose gradient is near 0 moves
    by up to 1e5 times its gradient's rounding (a few 1e-10 make 1e-5, what the AVX2 kernels' grouping gives);
    beyond that, the steps round u and theta + u: a few eps32 of |theta| + lr."""
    grad_tol = accumulated * EPS32 * float(grad_a.abs().max())
    grad_diff = float((grad_a - grad_b).abs().max())
    assert grad_diff <= grad_tol, f"{name}: gradients differ by {grad_diff:.3g} (> {grad_tol:.3g})"
    same_sign = grad_a.sign() == grad_b.sign()
    low = torch.where(same_sign, torch.minimum(grad_a.abs(), grad_b.abs()), torch.zeros_like(grad_a))
    bound = lr * eps / (low + eps) ** 2 * (grad_a - grad_b).abs() + 8 * EPS32 * (before.abs() + lr)
    excess = (a - b).abs() - bound
    worst = int(excess.argmax())
    assert float(excess.max()) <= 0, (
        f"{name}: parameters differ by {float((a - b).abs().flatten()[worst]):.3g} where one Adam step on gradients "
        f"{float(grad_a.flatten()[worst]):.3g} and {float(grad_b.flatten()[worst]):.3g} explains "
        f"{float(bound.flatten()[worst]):.3g}; largest difference {float((a - b).abs().max()):.3g}")


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_on_policy_the_update_weighs_by_its_own_pass_exactly_as_an_old_policy_pass_would(tmp_path, monkeypatch,
                                                                                           level):
    """On-policy, pi_old is the policy the update's own forward runs: the weights taken from that pass
    (no separate pass) give the gradients that weights from a separate old-policy pass give, up to float32
    rounding, and so move the parameters alike."""
    settings = dict(beta=0.04, rollout_is=level, rollout_is_cap=1.02, micro_batch_size=3, **BF16_ROLLOUTS_FP32_TRAINING)
    own = make_trainer(tmp_path / "own", **settings)
    before = {k: p.detach().clone() for k, p in own.policy.named_parameters()}
    seen = _capture_update(own, monkeypatch)
    own_grads = _gradients_of_each_step(own)
    own_metrics, _ = own.step()
    assert seen["old_logp"] is None and seen["advantages"].dim() == 1  # no extra pass, weights formed inside
    with monkeypatch.context() as m:
        _old_policy_pass(m)
        separate = make_trainer(tmp_path / "separate", **settings)
        separate_grads = _gradients_of_each_step(separate)
        separate_metrics, _ = separate.step()
    assert len(own_grads) == len(separate_grads) == 1  # one minibatch: one optimizer step each
    batch = seen["batch"]
    accumulated = batch.batch_size * (batch.prompt_ids.shape[1] + batch.completion_ids.shape[1])
    eps = own.rule.optimizer.param_groups[0]["eps"]
    for (name, a), b in zip(own.policy.named_parameters(), separate.policy.parameters()):
        _assert_same_first_adam_step(name, before[name], a.detach(), b.detach(), own_grads[0][name],
                                     separate_grads[0][name], own.config.lr, eps, accumulated)
    assert own_metrics["rollout/mismatch_kl"] > 0
    # on-policy the unweighted loss is 0 (advantages centred per group): loss/policy is all weights
    for key in ("rollout/mismatch_kl", "rollout/is_weight_mean", "rollout/is_capped_frac", "loss/policy",
                "optim/grad_norm"):
        assert own_metrics[key] == pytest.approx(separate_metrics[key], rel=1e-4, abs=1e-7), key


def test_off_the_correction_logs_the_mismatch_only_when_old_log_probs_exist(tmp_path, monkeypatch):
    on_policy = make_trainer(tmp_path / "a")
    metrics, _ = on_policy.step()
    assert not any(k.startswith("rollout/mismatch") for k in metrics)
    off_policy = make_trainer(tmp_path / "b", mu=2)
    seen = _capture_update(off_policy, monkeypatch)
    metrics, _ = off_policy.step()
    assert seen["advantages"].dim() == 1  # no weights without rollout_is
    # the built-in sampler at fp32: its log-probs are the trainer's up to rounding
    assert metrics["rollout/mismatch_kl"] == pytest.approx(0.0, abs=1e-6)


def test_bf16_rollouts_beside_fp32_training_are_corrected_for(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, beta=0.0, **BF16_ROLLOUTS_FP32_TRAINING)
    assert trainer.setup["formats"].startswith("rollouts bf16, training fp32")
    assert trainer.setup["rollout_is"] == "token"
    metrics, _ = trainer.step()
    assert metrics["rollout/mismatch_kl"] > 0  # bf16 sampling against fp32 scoring really differs
    assert 0 < metrics["rollout/is_weight_mean"] <= 1.001 + 1e-6  # the cap, up to float32 rounding


@pytest.mark.parametrize("fmt, mismatch_below", [
    pytest.param("bf16-weights", 0.01, marks=pytest.mark.skipif(bf16_weights.unavailable() is not None,
                                                                 reason="the bf16-weights kernel cannot run here")),
])
def test_weight_only_rollouts_train_under_the_correction(tmp_path, fmt, mismatch_below):
    trainer = make_trainer(tmp_path, beta=0.0, rollout_dtype=fmt)
    assert trainer.setup["formats"].startswith(f"rollouts {fmt}, training fp32")
    assert trainer.setup["rollout_is"] == "token"
    assert trainer.setup["rollout_compile"] == f"off ({fmt} rollouts run their decode steps eagerly)"
    assert trainer.setup["rollout_engine"].startswith("hf (")
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics, _ = trainer.step()
    # the copy samples near the trained weights, not exactly as they score
    assert 0 < metrics["rollout/mismatch_kl"] < mismatch_below and 0 < metrics["rollout/is_weight_mean"] <= 2.0 + 1e-6
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))
