"""The rollout importance-sampling correction inside the GRPO trainer: which tensors it uses,
what reaches the update, and what is logged."""

import pytest
import torch

from grouprl.algos.rollout_correction import truncated_is_weights
from grouprl.rollout import bf16_weights
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


def _bf16_rollouts_fp32_training(monkeypatch, tmp_path):
    import grouprl.models.precision as precision

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "bf16_speedup", lambda m, k, n, device, count=1: 3.0 if m <= 64 else 0.5)
    monkeypatch.setattr(precision, "int8_speedup", lambda m, k, n, device, count=1: None)


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


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_on_policy_the_update_weighs_by_its_own_pass_exactly_as_an_old_policy_pass_would(tmp_path, monkeypatch,
                                                                                           level):
    """On-policy, pi_old is the policy the update's own forward runs: the weights taken from that pass
    (no separate pass) move the parameters as weights from a separate old-policy pass do."""
    _bf16_rollouts_fp32_training(monkeypatch, tmp_path)
    settings = dict(beta=0.04, dtype="auto", rollout_is=level, rollout_is_cap=1.02, micro_batch_size=3)
    own = make_trainer(tmp_path / "own", **settings)
    seen = _capture_update(own, monkeypatch)
    own_metrics, _ = own.step()
    assert seen["old_logp"] is None and seen["advantages"].dim() == 1  # no extra pass, weights formed inside
    with monkeypatch.context() as m:
        _old_policy_pass(m)
        separate = make_trainer(tmp_path / "separate", **settings)
        separate_metrics, _ = separate.step()
    for (name, a), b in zip(own.policy.named_parameters(), separate.policy.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=name)  # 1% of one Adam step at lr 1e-3
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


def test_auto_samples_in_bf16_where_only_decoding_gains_and_corrects_for_it(tmp_path, monkeypatch):
    _bf16_rollouts_fp32_training(monkeypatch, tmp_path)
    trainer = make_trainer(tmp_path, beta=0.0, dtype="auto")
    assert trainer.setup["dtype"].startswith("rollouts bf16 (bf16 3.00x fp32), training fp32")
    assert trainer.setup["rollout_is"] == "token"
    metrics, _ = trainer.step()
    assert metrics["rollout/mismatch_kl"] > 0  # bf16 sampling against fp32 scoring really differs
    assert 0 < metrics["rollout/is_weight_mean"] <= 1.001 + 1e-6  # the cap, up to float32 rounding


@pytest.mark.parametrize("fmt, mismatch_below", [
    ("int8", 0.05),
    # the rounded copy samples nearer the trained weights than int8's quantized one
    pytest.param("bf16-weights", 0.01, marks=pytest.mark.skipif(bf16_weights.unavailable() is not None,
                                                                 reason="the bf16-weights kernel cannot run here")),
])
def test_weight_only_rollouts_train_under_the_correction(tmp_path, fmt, mismatch_below):
    trainer = make_trainer(tmp_path, beta=0.0, rollout_dtype=fmt)
    assert trainer.setup["dtype"].startswith(f"rollouts {fmt}, training fp32")
    assert trainer.setup["rollout_is"] == "token"
    assert trainer.setup["rollout_compile"] == f"off ({fmt} rollouts run their decode steps eagerly)"
    assert trainer.setup["rollout_engine"].startswith("hf (")
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics, _ = trainer.step()
    # the copy samples near the trained weights, not exactly as they score
    assert 0 < metrics["rollout/mismatch_kl"] < mismatch_below and 0 < metrics["rollout/is_weight_mean"] <= 2.0 + 1e-6
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))
