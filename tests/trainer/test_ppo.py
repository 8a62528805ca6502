"""PPO for language models: token rewards and GAE wiring, the loss against GRPO's, the critic's
alignment, warm-up, the adaptive KL controller, a separate critic, checkpoints, and learning."""

import pytest
import torch

from grouprl.algos import gae
from grouprl.config import check
from grouprl.models import tiny_causal_lm
from grouprl.models.value_head import make_critic
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.critic import token_rewards
from grouprl.trainer.trainer import Trainer
from tests.helpers.messages import named
from tests.helpers.trainer import digit_share, make_trainer, params_of, rollout, run_update


def make_ppo(tmp_path, critic_backbone=None, **overrides) -> Trainer:
    return make_trainer(tmp_path, algo="ppo", critic_backbone=critic_backbone, **{"beta": 0.05, **overrides})


def test_kl_shaped_token_rewards_and_gae_by_hand():
    # reward 1 on the last of 3 tokens, beta = 0.1, KL = 0.2, 0.1, 0.3 -> token rewards -0.02, -0.01, 0.97;
    # with V = 0 and gamma = lambda = 1 the advantages are the rewards-to-go 0.94, 0.96, 0.97
    r = token_rewards(torch.tensor([1.0]), torch.ones(1, 3), torch.tensor([[0.2, 0.1, 0.3]]), 0.1)
    adv, returns = gae(r, torch.zeros(1, 3), torch.ones(1, 3), 1.0, 1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.94, 0.96, 0.97]]))
    torch.testing.assert_close(returns, adv)
    # a shorter row gets its reward on its own last token; a NaN reward (no function applied) gives 0
    r = token_rewards(torch.tensor([2.0, float("nan")]), torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
                      torch.zeros(2, 3), 0.1)
    assert r.tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]


def test_step_feeds_the_update_outcome_returns_when_the_critic_is_fresh(tmp_path):
    # A fresh value head predicts 0, so with gamma = lambda = 1, no KL and no whitening every token's
    # advantage and return is its completion's reward.
    trainer = make_ppo(tmp_path, beta=0.0, kl_in_reward=False, gamma=1.0, gae_lambda=1.0, whiten_advantages=False)
    seen = {}

    def capture(data, step, beta):
        seen.update(batch=data.rollout, advantages=data.advantages, mask=data.mask, values=data.values,
                    returns=data.returns)
        return {}

    trainer.rule.update = capture
    trainer.step()
    batch, mask = seen["batch"], seen["mask"]
    rewards = torch.tensor(digit_share(None, batch.completions))
    torch.testing.assert_close(seen["values"], torch.zeros_like(mask))
    torch.testing.assert_close(seen["advantages"], rewards.unsqueeze(-1) * mask)
    torch.testing.assert_close(seen["returns"], rewards.unsqueeze(-1) * mask)


def test_ppo_policy_update_is_grpos_update_with_the_same_token_advantages(tmp_path):
    # c_v = 0 leaves only the clipped policy loss (the critic gets zero gradients, so the joint clip
    # norm is the policy's): the policy must move exactly as GRPO's update moves it.
    ppo = make_ppo(tmp_path / "ppo", beta=0.0, kl_in_reward=False, vf_coef=0.0, mu=2, minibatch_size=4)
    grpo = make_trainer(tmp_path / "grpo", beta=0.0, mu=2, minibatch_size=4)
    batch, _ = rollout(grpo)
    mask = batch.completion_mask
    adv = torch.linspace(-1, 1, batch.batch_size).unsqueeze(-1) * mask  # [B, T], varies by row
    old_logp = grpo.passes.old_logprobs(batch)
    zeros = torch.zeros_like(mask)
    run_update(ppo, batch, adv, old_logp, values=zeros, returns=zeros)
    run_update(grpo, batch, adv, old_logp)
    for (name, a), b in zip(ppo.policy.named_parameters(), grpo.policy.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=named(name))


def test_value_head_reads_the_state_before_each_token():
    torch.manual_seed(0)
    model, _ = tiny_causal_lm(seed=0)
    critic = make_critic(model)
    torch.nn.init.normal_(critic.head.weight)
    prompt, pmask = torch.tensor([[0, 5, 6]]), torch.tensor([[0, 1, 1]])  # left-padded
    comp, cmask = torch.tensor([[7, 8, 9]]), torch.ones(1, 3)
    values = critic(prompt, pmask, comp, cmask)
    changed = comp.clone()
    changed[0, 1] = 20  # token 1 changes: V before tokens 0 and 1 must not, V before token 2 must
    again = critic(prompt, pmask, changed, cmask)
    torch.testing.assert_close(values[0, :2], again[0, :2])
    assert (values[0, 2] - again[0, 2]).abs() > 1e-6
    # the copy is the policy's decoder, not shared with it
    assert critic.body is not model.model
    assert torch.equal(critic.body.embed_tokens.weight, model.model.embed_tokens.weight)


def test_critic_warmup_trains_only_the_critic(tmp_path):
    trainer = make_ppo(tmp_path, critic_warmup_steps=1, total_steps=2, beta=0.05)
    policy0, critic0 = params_of(trainer.policy), params_of(trainer.critic.model)
    metrics, _ = trainer.step()
    trainer.step_count += 1
    assert metrics["critic/warmup"] == 1.0 and "loss/policy" not in metrics
    assert all(torch.equal(p, policy0[k]) for k, p in params_of(trainer.policy).items())
    assert any(not torch.equal(p, critic0[k]) for k, p in params_of(trainer.critic.model).items())
    metrics, _ = trainer.step()
    assert metrics["critic/warmup"] == 0.0 and "loss/policy" in metrics
    assert any(not torch.equal(p, policy0[k]) for k, p in params_of(trainer.policy).items())


def test_adaptive_controller_moves_beta_by_the_measured_kl(tmp_path):
    trainer = make_ppo(tmp_path, total_steps=3, lr=1e-2, beta=0.1, kl_controller="adaptive", kl_target=0.01,
                       kl_horizon=16, eval_every=0)
    trainer.train()
    records = [r for r in trainer.metrics_log.records() if "kl/beta" in r]
    for now, nxt in zip(records, records[1:]):
        # beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * B / horizon), B = 8 rows
        error = min(max(now["policy/kl_sequence"] / 0.01 - 1, -0.2), 0.2)
        assert nxt["kl/beta"] == pytest.approx(now["kl/beta"] * (1 + error * 8 / 16), rel=1e-6)
    assert records[0]["policy/kl_sequence"] == 0.0  # the first rollout is the reference's own
    assert records[-1]["kl/beta"] != records[0]["kl/beta"]
    fixed = make_ppo(tmp_path / "fixed", total_steps=2, kl_controller="fixed", beta=0.1, eval_every=0)
    fixed.train()
    assert {r["kl/beta"] for r in fixed.metrics_log.records() if "kl/beta" in r} == {0.1}


def test_separate_smaller_critic(tmp_path):
    small, _ = tiny_causal_lm(seed=1, hidden_size=32, num_layers=1, num_heads=2)
    trainer = make_ppo(tmp_path, critic_backbone=small, total_steps=1, eval_every=0)
    assert trainer.critic.model.body is small.model and trainer.critic.model.head.in_features == 32
    n_critic = sum(p.numel() for p in trainer.critic.model.parameters())
    assert n_critic < sum(p.numel() for p in trainer.policy.parameters()) / 2
    trainer.train()
    with pytest.raises(ValueError, match="vocabulary"):
        big_vocab_policy, _ = tiny_causal_lm(seed=0)
        big_vocab_policy.resize_token_embeddings(big_vocab_policy.config.vocab_size + 10)
        make_critic(big_vocab_policy, small)


def test_resume_restores_critic_and_controller(tmp_path):
    first = make_ppo(tmp_path, total_steps=2, kl_controller="adaptive", kl_target=0.01, kl_horizon=16, lr=1e-2,
                     eval_every=0)
    first.train()
    resumed = make_ppo(tmp_path, total_steps=2, kl_controller="adaptive", kl_target=0.01, kl_horizon=16, lr=1e-2,
                       eval_every=0)
    resumed.resume("latest")
    assert resumed.kl.beta == first.kl.beta != 0.05
    for k, p in params_of(first.critic.model).items():
        assert torch.equal(params_of(resumed.critic.model)[k], p), k
    saved = first.critic.optimizer.state_dict()["state"]
    loaded = resumed.critic.optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[i]["exp_avg"], loaded[i]["exp_avg"]) for i in saved)


def test_config_errors():
    with pytest.raises(ValueError, match="kl_controller='pid'"):
        check(TrainerConfig(algo="ppo", kl_controller="pid"))
    with pytest.raises(ValueError, match="gae_lambda"):
        check(TrainerConfig(algo="ppo", gae_lambda=1.5))
    # beta = 0 leaves nothing to place in the reward
    assert not TrainerConfig(algo="ppo", beta=0.0).kl_penalty_in_reward
    assert TrainerConfig(algo="ppo").kl_penalty_in_reward
    assert not TrainerConfig(algo="grpo").kl_penalty_in_reward


def test_ppo_learns_a_learnable_reward(tmp_path):
    trainer = make_ppo(tmp_path, prompts_per_step=4, group_size=8, max_new_tokens=4, total_steps=12, lr=1e-2,
                       micro_batch_size=32, eval_every=0, log_completions_every=0)
    trainer.train()
    rewards = [r["reward/mean"] for r in trainer.metrics_log.records() if "reward/mean" in r]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.3, rewards
