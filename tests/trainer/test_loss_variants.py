"""The loss variants through the trainer: the config refuses a variant's keys under another, each variant
trains a tiny model a step, on multi-turn trajectories with GiGPO's step advantages the environment's tokens
get exactly zero gradient, the masked rollout corrections weigh what reaches the update, and the
high-entropy selection is taken over the minibatch (so the micro-batch size does not change the step)."""

from __future__ import annotations

import pytest
import torch

from grouprl.algos import POLICY_LOSSES
from grouprl.algos.rollout_correction import ROLLOUT_IS_LEVELS, rollout_is_weights
from grouprl.config import check
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.loss_variants import POLICY_LOSS_KEYS, ROLLOUT_IS_KEYS, policy_options
from tests.helpers.agents import make_agent_trainer
from tests.helpers.messages import named
from tests.helpers.trainer import make_trainer, params_of

VARIANTS = [{"policy_loss": "cispo"}, {"policy_loss": "sapo"}, {"policy_loss": "gmpo"},
            {"top_entropy_quantile": 0.3}, {"rollout_is": "icepop"}, {"rollout_is": "sequence-mask"}]
"""One setting per variant (the rest at their defaults)."""


def _ids(settings):
    return "-".join(f"{k}={v}" for k, v in settings.items())


def test_the_key_tables_name_every_registered_variant():
    assert sorted(POLICY_LOSS_KEYS) == POLICY_LOSSES.names()
    assert sorted(ROLLOUT_IS_KEYS) == ROLLOUT_IS_LEVELS.names()
    c = TrainerConfig(policy_loss="gmpo", gmpo_eps_low=0.3)
    assert policy_options(c) == {"eps_low": 0.3, "eps_high": None}


@pytest.mark.parametrize("settings, message", [
    ({"policy_loss": "sapo", "cispo_eps_high": 1.0},
     "cispo_eps_high=1.0 is a setting of policy_loss cispo; policy_loss=sapo does not read it"),
    ({"policy_loss": "cispo", "dual_clip": 3.0}, "dual_clip=3.0 is a setting of policy_loss clip"),
    ({"sapo_tau_neg": 2.0}, "sapo_tau_neg=2.0 is a setting of policy_loss sapo; policy_loss=clip does not read it"),
    ({"rollout_is": "token", "icepop_high": 3.0}, "icepop_high=3.0 is a setting of rollout_is icepop"),
    ({"rollout_is": "icepop", "rollout_is_cap": 3.0},
     "rollout_is_cap=3.0 is a setting of rollout_is token or sequence"),
    ({"rollout_is": "auto", "sequence_mask_low": 0.99},
     "sequence_mask_low=0.99 is a setting of rollout_is sequence-mask"),
    ({"policy_loss": "cisp"}, "policy_loss='cisp' is not one of: cispo, clip, gmpo, sapo"),
    ({"rollout_is": "icepop", "icepop_low": 1.2}, "0 <= icepop_low <= 1 <= icepop_high"),
    ({"top_entropy_quantile": 0.0}, "top_entropy_quantile=0.0 must be in \\(0, 1\\]"),
    ({"policy_loss": "sapo", "sapo_tau_pos": -1.0}, "sapo_tau_pos=-1.0 must be a finite number > 0"),
    ({"algo": "trpo", "top_entropy_quantile": 0.2}, "top_entropy_quantile=0.2 applies to the clipped-surrogate update"),
])
def test_a_variants_keys_are_refused_under_another_naming_the_owner(settings, message):
    with pytest.raises(ValueError, match=message):
        check(TrainerConfig(**settings))


def test_a_variants_own_keys_are_accepted():
    TrainerConfig(policy_loss="cispo", cispo_eps_low=0.2, cispo_eps_high=1.0, rollout_is="icepop", icepop_high=3.0)
    TrainerConfig(policy_loss="gmpo", gmpo_eps_low=0.3, rollout_is="sequence-mask", sequence_mask_low=0.99)
    TrainerConfig(rollout_is="auto", rollout_is_cap=3.0)  # auto may resolve to token, which reads the cap


@pytest.mark.parametrize("settings", VARIANTS, ids=_ids)
def test_each_variant_trains_a_tiny_model_a_step(tmp_path, settings):
    # off-policy (two minibatches, two passes): where the variants differ from the clipped surrogate
    trainer = make_trainer(tmp_path, total_steps=1, mu=2, minibatch_size=4, **settings)
    before = params_of(trainer.policy)
    metrics, _ = trainer.step()
    moved = [k for k, v in params_of(trainer.policy).items() if not torch.equal(v, before[k])]
    assert moved, "no parameter moved"
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith(("loss/", "policy/")))


def _spy_on_training_passes(trainer, monkeypatch):
    """Keep every with-grad log-prob pass of the update (its rows and its logp, whose .grad is retained)."""
    seen, real = [], trainer.passes.logprobs

    def logprobs(model, batch, rows=None, with_entropy=False, only=None):
        out = real(model, batch, rows, with_entropy, only)
        if rows is not None and torch.is_grad_enabled():
            out[0].retain_grad()
            seen.append((batch, rows, out[0]))
        return out

    monkeypatch.setattr(trainer.passes, "logprobs", logprobs)
    return seen


@pytest.mark.parametrize("settings", [{"policy_loss": "clip"}, *VARIANTS], ids=_ids)
def test_on_trajectories_with_step_advantages_environment_tokens_get_exactly_zero_gradient(tmp_path, monkeypatch,
                                                                                          settings):
    trainer = make_agent_trainer(tmp_path, advantage="gigpo", total_steps=1, prompts_per_step=2, group_size=4,
                                 beta=0.04, entropy_coef=0.01, **settings)
    seen = _spy_on_training_passes(trainer, monkeypatch)
    before = params_of(trainer.policy)
    trainer.step()
    assert any(not torch.equal(v, before[k]) for k, v in params_of(trainer.policy).items())
    env_tokens = policy_grads = 0
    for batch, rows, logp in seen:
        policy = batch.completion_mask[rows] > 0
        environment = (batch.sequence_mask[rows] > 0) & ~policy
        env_tokens += int(environment.sum())
        assert torch.equal(logp.grad[environment], torch.zeros(int(environment.sum()))), "environment token gradient"
        policy_grads += int((logp.grad[policy] != 0).sum())
    assert env_tokens > 0 and policy_grads > 0  # there were environment tokens, and the policy's learnt


BF16_ROLLOUTS = {"dtype": "fp32", "rollout_dtype": "bf16"}
"""Rollouts in bf16 against fp32 training: a real, small engine/trainer mismatch."""


@pytest.mark.parametrize("level, knobs", [
    ("icepop", {"icepop_low": 0.999, "icepop_high": 1.001}),
    ("sequence-mask", {"sequence_mask_low": 0.9999, "sequence_mask_high": 1.0001}),
])
def test_masked_corrections_weigh_what_reaches_the_update(tmp_path, monkeypatch, level, knobs):
    """Off-policy the weights come from the old-policy pass: the update gets A_i * w_it, w from the band."""
    trainer = make_trainer(tmp_path, beta=0.0, mu=2, rollout_is=level, **knobs, **BF16_ROLLOUTS)
    seen, real = {}, trainer.rule.update

    def update(data, step, beta):
        seen.update(batch=data.rollout, advantages=data.advantages.clone(), old_logp=data.old_logp, mask=data.mask)
        return real(data, step, beta)

    monkeypatch.setattr(trainer.rule, "update", update)
    metrics, records = trainer.step()
    band = {k.rsplit("_", 1)[1]: v for k, v in knobs.items()}
    weights, _ = rollout_is_weights(seen["old_logp"], seen["batch"].sampling_logprobs, seen["mask"], level=level,
                                    **band)
    row_advantages = torch.tensor([r["advantage"] for r in records])
    torch.testing.assert_close(seen["advantages"], row_advantages.unsqueeze(-1) * weights)
    assert metrics["rollout/mismatch_kl"] > 0 and 0 < metrics["rollout/is_masked_frac"] < 1  # some dropped, not all


def test_the_entropy_quantile_is_the_minibatchs_so_micro_batches_do_not_change_the_step(tmp_path):
    settings = dict(top_entropy_quantile=0.25, beta=0.0, total_steps=1)
    whole = make_trainer(tmp_path / "whole", micro_batch_size=8, **settings)
    whole_metrics, _ = whole.step()
    pieces = make_trainer(tmp_path / "pieces", micro_batch_size=3, **settings)
    pieces_metrics, _ = pieces.step()
    for key in ("policy/entropy_threshold", "policy/entropy_selected_frac", "optim/grad_norm", "loss/policy"):
        assert pieces_metrics[key] == pytest.approx(whole_metrics[key], rel=1e-5), key
    for (name, a), b in zip(whole.policy.named_parameters(), pieces.policy.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=named(name))  # 1% of one Adam step at lr 1e-3
    # a quarter of the loss tokens (ties and rounding aside)
    assert abs(whole_metrics["policy/entropy_selected_frac"] - 0.25) < 0.05
