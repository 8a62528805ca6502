"""What the policy's update holds in memory: the gradients only while it runs, the layers' activations
recomputed in backward unless checkpointing is set off."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.trainer import make_trainer, params_of, rollout, run_update


def test_the_update_frees_its_gradients(tmp_path):
    """Spent once the last optimizer step is taken: none is left to sit under the next rollout."""
    trainer = make_trainer(tmp_path, beta=0.0)
    batch, _ = rollout(trainer)
    before = params_of(trainer.policy)
    run_update(trainer, batch, torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0]))
    assert any(not torch.equal(p, before[k]) for k, p in trainer.policy.named_parameters())
    assert all(p.grad is None for p in trainer.policy.parameters())


@pytest.mark.parametrize("setting, checkpointed", [(None, True), (False, False)])
def test_the_policy_is_checkpointed_as_resolved(tmp_path, setting, checkpointed):
    trainer = make_trainer(tmp_path, gradient_checkpointing=setting)
    policy = trainer.policy  # the flag by the name the installed transformers gives it (the old one warns in 5.24)
    flag = getattr(policy, "is_activation_checkpointing", None)
    assert (policy.is_gradient_checkpointing if flag is None else flag) is checkpointed
