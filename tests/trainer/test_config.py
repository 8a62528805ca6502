import pytest

from grouprl.config import check
from grouprl.trainer.config import GRPOConfig
from grouprl.trainer.sampling import eval_params, rollout_params


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"group_size": 1}, "set group_size >= 2"),
        ({"minibatch_size": 0}, "set a positive number of rows"),
        ({"minibatch_size": 6, "group_size": 4}, "multiple of group_size=4"),
        ({"minibatch_size": 8, "group_size": 4, "prompts_per_step": 3}, "divide prompts_per_step"),
        ({"temperature": 0.0}, "greedy sampling"),
        ({"beta": 0.0, "kl_in_reward": True}, "kl_in_reward needs beta > 0"),
        ({"beta": 0.0, "ref_sync_steps": 5}, "ref_sync_steps > 0 needs beta > 0"),
        ({"aggregation": "mean"}, "aggregation='mean' is not one of"),
        ({"advantage": "gae"}, "advantage='gae' is not one of: gigpo, grpo, rank, reinforce, rloo"),
        ({"dual_clip": 0.5}, "dual_clip=0.5 must be > 1"),
        ({"lora_rank": 8, "ref_sync_steps": 2}, "not available with LoRA"),
        ({"rollout_dtype": "fp8"}, "rollout_dtype='fp8' is not one of: auto, bf16, bf16-weights, fp32"),
    ],
)
def test_invalid_settings_say_what_to_change(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check(GRPOConfig(**kwargs))


def test_off_policy_detection():
    assert not GRPOConfig(prompts_per_step=2, group_size=4).off_policy
    assert GRPOConfig(prompts_per_step=2, group_size=4, mu=2).off_policy
    assert GRPOConfig(prompts_per_step=2, group_size=4, minibatch_size=4).off_policy
    assert not GRPOConfig(prompts_per_step=2, group_size=4, minibatch_size=8).off_policy
    assert not GRPOConfig(beta=0.0).needs_reference


def test_sampling_params_mirror_the_config():
    p = GRPOConfig(temperature=0.7, top_p=0.9, max_new_tokens=12, stop_strings=("</answer>",), dtype="bf16")
    sp = rollout_params(p, (5,))
    assert (sp.temperature, sp.top_p, sp.max_new_tokens, sp.stop_strings, sp.stop_token_ids, sp.format) == (
        0.7, 0.9, 12, ("</answer>",), (5,), "bf16")


@pytest.mark.parametrize("key, value", [
    ("lr", -1.0), ("lr", float("nan")), ("adam_beta1", 1.0), ("adam_beta2", -0.1), ("weight_decay", -1.0),
    ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1), ("repetition_penalty", 0.0), ("eval_temperature", -1.0),
    ("max_grad_norm", -1.0), ("warmup_steps", -1), ("save_every", -1),
])
def test_every_bad_value_is_refused_by_its_key(key, value):
    from grouprl.trainer.config import TrainerConfig

    with pytest.raises(ValueError, match=rf"{key}={value}"):
        check(TrainerConfig(**{key: value}))


def test_gradient_checkpointing_is_on_unless_set_off_or_the_update_differentiates_twice():
    from grouprl.trainer.config import TrainerConfig

    assert GRPOConfig().checkpointing and TrainerConfig(algo="ppo").checkpointing
    assert not GRPOConfig(gradient_checkpointing=False).checkpointing
    assert not TrainerConfig(algo="trpo").checkpointing  # Fisher-vector products: a double backward


def test_evaluation_samples_in_the_rollout_format():
    assert eval_params(GRPOConfig(dtype="bf16")).format == "bf16"
    assert eval_params(GRPOConfig(dtype="bf16", rollout_dtype="fp32")).format == "fp32"


@pytest.mark.parametrize("fmt", ["bf16-weights"])
def test_weight_only_rollouts_are_the_built_in_engines(monkeypatch, fmt):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    with pytest.raises(ValueError, match=f"rollout_dtype={fmt} is the built-in engine's"):
        check(GRPOConfig(rollout_dtype=fmt, rollout_engine="vllm"))


def test_bf16_weights_rollouts_sample_and_evaluate_in_bf16_weights():
    config = GRPOConfig(rollout_dtype="bf16-weights")
    assert config.rollout_format == "bf16-weights" and rollout_params(config).format == "bf16-weights"
    assert eval_params(config).format == "bf16-weights" and config.rollout_is_level == "token"
