"""What the vLLM engine samples, run for real when the package is installed: log-probs against the
trainer's, draws from the model's own distribution (as the built-in engine's), rows that draw alike whatever
batch they are in, and what it leaves of the process as it was."""

from __future__ import annotations

import math

import pytest
import torch

from grouprl.rollout.logprobs import token_logprobs
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams
from tests.helpers.rollout import assert_thread_count_can_change
from tests.helpers.vllm import SHAPE, model_and_tok, needs_vllm, prompts


@needs_vllm
def test_sampled_log_probs_equal_the_trainers(engine):
    model, tok = model_and_tok(seed=4)
    engine.update_weights(model)
    batch = engine.generate(prompts(tok, 6), 4, SamplingParams(max_new_tokens=16), seed=list(range(24)))
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                 batch.completion_mask)
    mask = batch.completion_mask > 0
    assert (logp - batch.sampling_logprobs)[mask].abs().max() < 1e-3  # fp32 against fp32: rounding only


def pearson(draws: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's chi-square of token ids ``draws`` [N] against ``probs`` [V]: a bin for each token expected at
    least 5 times, the rest pooled in one; (statistic, degrees of freedom)."""
    counts = torch.bincount(draws, minlength=probs.numel()).double()
    expected = probs.double() * draws.numel()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    return float(((obs - exp)[keep] ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


def far_out(stat: float, df: int) -> bool:
    """Beyond the mean plus 5 standard deviations of a chi-square on ``df`` degrees of freedom (df + 5 sqrt(2 df))."""
    return stat > df + 5 * math.sqrt(2 * df)


@pytest.mark.slow
@needs_vllm
def test_both_engines_draw_from_the_models_distribution_at_the_set_temperature(engine):
    """Accuracies measured through vLLM and through the built-in engine compare only if both draw from one
    distribution. 2000 seeded first tokens of each against softmax(logits / 0.7), by Pearson's chi-square (fixed
    seeds, so the statistic is fixed too: vLLM's was 97 on 111 df where the bound is 186). The same draws are
    far out against temperatures 0.6 and 1, so a setting lost on its way into vLLM fails the test."""
    model, tok = model_and_tok(seed=7)
    ids, n, temp = prompts(tok, 1), 2000, 0.7
    with torch.no_grad():
        model.model.norm.weight.fill_(2.5)  # sharper than a random model's near-uniform logits: top token ~0.29
        logits = model(torch.tensor(ids)).logits[0, -1]  # [V]
    engine.update_weights(model)
    params = SamplingParams(max_new_tokens=1, temperature=temp)
    for name, sampler in (("vllm", engine), ("built-in", Sampler(model, tok))):
        first = sampler.generate(ids, n, params, seed=list(range(n))).completion_ids[:, 0]  # [N]
        stat, df = pearson(first, torch.softmax(logits / temp, -1))
        assert not far_out(stat, df), f"{name}: chi-square {stat:.1f} on {df} df against temperature {temp}"
        for other in (0.6, 1.0):
            wrong, wrong_df = pearson(first, torch.softmax(logits / other, -1))
            assert far_out(wrong, wrong_df), f"{name}: chi-square {wrong:.1f} on {wrong_df} df cannot tell {other}"


@needs_vllm
def test_a_row_draws_the_same_completion_whatever_else_is_in_the_batch(engine):
    model, tok = model_and_tok(seed=5)
    engine.update_weights(model)
    ids, params = prompts(tok, 4), SamplingParams(max_new_tokens=10)
    seeds = [101, 102, 103, 104, 105, 106, 107, 108]
    whole = engine.generate(ids, 2, params, seed=seeds)
    half = engine.generate(ids[2:], 2, params, seed=seeds[4:])
    assert whole.completion_ids[4:, :half.completion_ids.shape[1]].tolist() == half.completion_ids.tolist()


@needs_vllm
def test_seeded_rows_whose_prompts_overflow_one_batch_are_drawn_whole(engine):
    """More prompt tokens than one engine step takes (48 x 200 > 8192): a prompt prefilled in chunks
    would make vLLM rewind its row's seeded CPU generator, which CPU generators cannot do."""
    model, tok = model_and_tok(seed=5)
    engine.update_weights(model)
    ids = [[(7 * i + j) % 200 + 3 for j in range(200)] for i in range(48)]
    params = SamplingParams(max_new_tokens=4)
    seeds = list(range(1000, 1048))
    batch = engine.generate(ids, 1, params, seed=seeds)
    assert batch.batch_size == 48 and int(batch.completion_mask.sum()) > 0
    alone = engine.generate(ids[40:41], 1, params, seed=seeds[40:41])
    assert batch.completion_ids[40, :alone.completion_ids.shape[1]].tolist() == alone.completion_ids[0].tolist()


@pytest.mark.slow  # starts a vLLM engine of its own
@needs_vllm
def test_vllm_start_up_notices_stay_quiet_unless_asked_for():
    """vLLM's notices from before an engine configures its logger (its Triton lacks a CPU backend) and its
    FutureWarning about a torch name are not printed into a run; a user's VLLM_LOGGING_LEVEL still wins."""
    import os
    import subprocess
    import sys

    code = "from grouprl.rollout.engines import require_vllm; require_vllm(); import vllm.triton_utils"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    quiet = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert "Triton" not in quiet.stderr and "FutureWarning" not in quiet.stderr, quiet.stderr
    loud = subprocess.run([sys.executable, "-W", "default", "-c", code], env={**env, "VLLM_LOGGING_LEVEL": "INFO"},
                          capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0, loud.stderr
    if not torch.cuda.is_available():  # the notice is the CPU build's
        assert "Triton" in loud.stderr, loud.stderr


@needs_vllm
def test_an_engine_leaves_the_process_thread_count_to_its_owner(engine):
    """vLLM's CPU worker turns torch.set_num_threads into a no-op when it starts; a run (or a user's code)
    that sets the thread count after an engine exists must still get what it asked for."""
    assert_thread_count_can_change()


@pytest.mark.slow  # starts a vLLM engine of its own
@needs_vllm
def test_an_engine_leaves_the_process_memory_on_every_numa_node():
    """vLLM's CPU worker binds its process's memory to one NUMA node on start (right for a process of its
    own, wrong for a trainer's that holds optimizer state on every node): the policy is as before."""
    import subprocess
    import sys

    from grouprl.rollout.process_state import memory_policy

    if memory_policy() is None:
        pytest.skip("no NUMA memory policy calls here")
    code = ("from grouprl.rollout.process_state import memory_policy; before = memory_policy()\n"
            "from grouprl.models import tiny_causal_lm\n"
            "from grouprl.rollout.vllm import VLLMSampler\n"
            f"model, tok = tiny_causal_lm(seed=0, **{SHAPE!r})\n"
            "VLLMSampler(model, tok, max_model_len=64, dtype='float32', max_rows=2)\n"
            "print(before == memory_policy(), before, memory_policy()[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].startswith("True"), out.stdout
