"""Training across processes, two processes spawned inside pytest (gloo, FileStore rendezvous).

- 2 processes x half the batch end 3 steps with the weights and metrics of 1 process x the whole
  batch, under DDP (with the rollout importance weights on) and FSDP2 (with the batch-std scale);
- a checkpoint written by 2 processes resumes in 2 processes and continues identically, and its
  gathered model/ folder loads as a plain model;
- a reward function that raises in one process stops both, each with the error shown;
- (slow) LoRA, CPU offload, sequence-level importance weights, reference sync with its resume,
  bf16 mixed precision, and an evaluation split over the processes.

The one-process runs go first, in this process; the two processes are forked afterwards from a
fork server that has imported the trainer but never trained (see ``tests.helpers.dist.start_group``).
"""

import copy
import json

import pytest
import torch

from grouprl.models import load_policy, tiny_causal_lm
from grouprl.report.data import read_jsonl
from tests.helpers.dist import (
    SCENARIOS,
    SETTINGS,
    VARIANTS,
    build,
    full_weights,
    metrics_lines,
    start_group,
    two_process_group,
    variant_group,
)
from tests.helpers.messages import named

TOLERANCE = 1e-5
COMPARED_METRICS = ("reward/mean", "reward/std", "loss/total", "loss/policy", "policy/kl", "policy/entropy",
                    "rollout/len_mean", "optim/grad_norm")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One-process references for every scenario, then every two-process scenario in one group."""
    out = tmp_path_factory.mktemp("distributed")
    single = {}
    for name, settings in SCENARIOS.items():
        trainer = build(out / "single", name, **settings)
        trainer.train()
        single[name] = {"weights": full_weights(trainer), "metrics": metrics_lines(out / "single" / name / "run")}
    start_group(two_process_group, out)
    return out, single


def result(out, name, rank=0):
    r = torch.load(out / f"{name}-rank{rank}.pt", weights_only=False)
    assert "error" not in r, r.get("trace")
    return r


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_two_processes_on_half_the_batch_train_like_one_process_on_all_of_it(runs, name):
    out, single = runs
    got, want = result(out, name), single[name]
    start = tiny_causal_lm(seed=0)[0].state_dict()
    moved = max(float((want["weights"][k] - start[k]).abs().max()) for k in start)
    assert moved > 100 * TOLERANCE  # the comparison below is about steps that did something
    for key, expected in want["weights"].items():
        torch.testing.assert_close(got["weights"][key], expected, atol=TOLERANCE, rtol=0, msg=named(key))
    steps = [r for r in got["metrics"] if "loss/total" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(0 < r["rollout/zero_std_frac"] < 1 for r in steps)  # rows out of the loss, and rows in it
    for mine, theirs in zip(steps, [r for r in want["metrics"] if "loss/total" in r]):
        for key in COMPARED_METRICS:
            assert mine[key] == pytest.approx(theirs[key], abs=TOLERANCE), (mine["step"], key)
    completions = read_jsonl(out / name / "run" / "completions.jsonl")
    per_step = SETTINGS["prompts_per_step"] * SETTINGS["group_size"]
    assert len(completions) == 3 * per_step  # every process's completions, written once


def test_a_two_process_checkpoint_resumes_in_two_processes_identically(runs):
    out, _ = runs
    straight, resumed = result(out, "fsdp"), result(out, "resumed")
    for key, expected in straight["weights"].items():
        assert torch.equal(resumed["weights"][key], expected), key
    assert resumed["metrics"][-1]["step"] == 3
    for key in COMPARED_METRICS:
        assert resumed["metrics"][-1][key] == straight["metrics"][-1][key], key
    folder = out / "fsdp" / "run" / "checkpoints" / "step-000003"
    assert json.loads((folder / "state.json").read_text())["world_size"] == 2
    plain, _ = load_policy(str(folder / "model"))  # the gathered policy is an ordinary model folder
    for key, value in plain.state_dict().items():
        assert torch.equal(value, straight["weights"][key]), key


def test_a_reward_function_raising_in_one_process_stops_every_process_with_its_error(runs):
    out, _ = runs
    failing = torch.load(out / "reward_error-rank1.pt", weights_only=False)["error"]
    other = torch.load(out / "reward_error-rank0.pt", weights_only=False)["error"]
    assert failing.startswith("RewardFunctionError") and "fails_on_rank_one" in failing
    assert "divides by zero" in failing
    assert other.startswith("DistributedError: process 1 of 2 stopped the run: RewardFunctionError")
    assert "divides by zero" in other


# --------------------------------------------------------------------------- slower variants


@pytest.fixture(scope="module")
def variant_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("variants")
    single = {}
    for name, settings in VARIANTS.items():
        trainer = build(out / "single", name, **settings)
        trainer.train()
        single[name] = full_weights(trainer)
        if name == "fsdp_lora":
            single["lora_model"] = trainer.policy  # a plain peft model, to merge the two processes' weights in
    trainer = build(out / "single", "eval", eval_samples=2, evaluated=True)
    single["evaluation"] = trainer.evaluate()
    start_group(variant_group, out)
    return out, single


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in VARIANTS if n != "fsdp_bf16"])
def test_variants_on_two_processes_train_like_one_process(variant_runs, name):
    """LoRA under FSDP, CPU offload, DDP with sequence-level importance weights and the KL in the
    reward, and reference sync (the reference sharded and moved every step)."""
    out, single = variant_runs
    got = result(out, name)["weights"]
    # DDP must run the wrapped model's own forward, so its log-probs come from the full logits while
    # one process reads the head at the predicting positions only: the same numbers to float rounding,
    # which Adam's m / sqrt(v) magnifies on near-zero gradients over 3 steps at lr 1e-3.
    atol = 3 * TOLERANCE if VARIANTS[name]["engine"] == "ddp" else TOLERANCE
    for key, expected in single[name].items():
        torch.testing.assert_close(got[key], expected, atol=atol, rtol=0, msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.slow
def test_bf16_mixed_precision_trains_and_keeps_float32_weights(variant_runs):
    out, single = variant_runs
    got = result(out, "fsdp_bf16")["weights"]
    start = tiny_causal_lm(seed=0)[0].state_dict()
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in got.values())
    assert max(float((got[k] - start[k]).abs().max()) for k in start) > 1e-4
    # bf16 forward and backward, fp32 reduction and optimizer: near the fp32 run, not equal to it
    assert max(float((got[k] - single["fsdp_bf16"][k]).abs().max()) for k in start) < 5e-2


@pytest.mark.slow
def test_a_synced_reference_is_checkpointed_and_resumed(variant_runs):
    out, _ = variant_runs
    straight, resumed = result(out, "fsdp_ref_sync"), result(out, "ref_sync_resumed")
    start = tiny_causal_lm(seed=0)[0].state_dict()
    assert max(float((straight["reference"][k] - start[k]).abs().max()) for k in start) > 1e-4  # it moved
    for part in ("weights", "reference"):
        for key, expected in straight[part].items():
            assert torch.equal(resumed[part][key], expected), (part, key)


@pytest.mark.slow
def test_evaluation_split_over_processes_equals_one_process(variant_runs):
    out, single = variant_runs
    got = result(out, "evaluation")["eval"]
    assert got.keys() == single["evaluation"].keys()
    for key, value in single["evaluation"].items():
        assert got[key] == pytest.approx(value, abs=1e-6), key


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_rollout_server_push_reads_the_whole_weights_under_ddp_and_fsdp(runs, name):
    out, _ = runs
    r = result(out, name)
    assert r["files"].keys() == r["weights"].keys() and r["sent"].keys() == r["weights"].keys()
    for key, value in r["weights"].items():  # FSDP: each shard gathered; DDP: the replica's own tensors
        assert torch.equal(r["files"][key], value) and torch.equal(r["sent"][key], value), key
    # a write that failed midway in process 0 read the rest of the weights, so every process's gathers paired up
    # and the push after it (``sent``, read after the failure) holds the whole weights
    assert r["failed"] == "No space left on device"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fsdp_lora", "fsdp_offload"])
def test_a_rollout_server_push_gathers_every_shard_and_merges_lora_as_peft_does(variant_runs, name):
    out, single = variant_runs
    r = result(out, name)
    assert r["files"].keys() == r["weights"].keys()
    for key, value in r["weights"].items():  # the files transport: the whole state, each shard gathered
        assert torch.equal(r["files"][key], value), key
    if name == "fsdp_offload":
        assert r["sent"].keys() == r["weights"].keys() and all(torch.equal(r["sent"][k], v)
                                                              for k, v in r["weights"].items())
        return
    # a collective transport: the adapters merged into the base, as peft merges the same weights
    model = copy.deepcopy(single["lora_model"])
    model.load_state_dict(r["weights"])
    want = model.merge_and_unload().state_dict()
    assert list(r["sent"]) == list(want)
    bases = {k: f"base_model.model.{k.removesuffix('.weight')}.base_layer.weight" for k in want}
    merged = [k for k, base in bases.items() if base in r["weights"]]
    assert merged and max(float((r["sent"][k] - r["weights"][bases[k]]).abs().max()) for k in merged) > 1e-4
    for key, value in want.items():
        torch.testing.assert_close(r["sent"][key], value, atol=1e-6, rtol=0, msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.slow
def test_a_weight_push_gathers_every_fsdp_shard(variant_runs):
    out, _ = variant_runs
    r = result(out, "evaluation")
    assert r["pushed"].keys() == r["weights"].keys()
    for key, value in r["weights"].items():
        assert torch.equal(r["pushed"][key], value), key


def test_metrics_combine_over_processes_by_their_kind(monkeypatch):
    """Losses, throughputs and a judge's dropped groups add up; times take the slowest process; the
    rest is a token-weighted mean (checked without a process group: the gather is given)."""
    from grouprl.trainer.dist import processes as dist_processes

    parts = [(30.0, {"loss/total": 0.25, "judge/dropped_groups": 1.0, "time/step": 2.0, "reward/mean": 1.0}),
             (10.0, {"loss/total": 0.5, "judge/dropped_groups": 2.0, "time/step": 3.0, "reward/mean": 0.0})]
    monkeypatch.setattr(dist_processes, "gather_objects", lambda obj: parts)
    combined = dist_processes.Processes.combine(object.__new__(dist_processes.Processes), parts[0][1], 30.0)
    assert combined == {"loss/total": 0.75, "judge/dropped_groups": 3.0, "time/step": 3.0, "reward/mean": 0.75}
