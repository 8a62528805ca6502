"""A teacher on a ``grouprl serve`` server: its log-probs of the sampled tokens are the in-process model's, and a
run distils through it (a real server of the tiny head-64 model on loopback)."""

from __future__ import annotations

import json

import pytest
import torch

from grouprl.models import tiny_causal_lm
from grouprl.trainer.teacher import ModelTeacher, ServerTeacher
from grouprl.trainer.trainer import Trainer
from tests.helpers.servers import TINY64, started
from tests.helpers.trainer import PROMPTS, base_config

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not __import__("importlib").util.find_spec("vllm"),
                                                   reason="needs vLLM")]


def test_a_server_teacher_scores_tokens_as_the_same_model_in_process_and_a_run_distils_through_it(tmp_path):
    with started(tmp_path / "servers", 1, max_rows=64) as servers:
        address = f"http://{servers['addresses'][0]}"
        torch.manual_seed(0)
        student, tok = tiny_causal_lm(seed=1, **TINY64)
        config = base_config(tmp_path, teacher_model=address, distill_coef=1.0, total_steps=2, beta=0.0,
                             eval_every=0, temperature=1.0)
        trainer = Trainer(config, policy=student, tokenizer=tok, train_data=PROMPTS)
        assert isinstance(trainer.teacher, ServerTeacher)
        got = trainer.collector.collect(0, __import__("grouprl.run.logs", fromlist=["PhaseTimer"]).PhaseTimer())
        served = trainer.teacher.logprobs(got.batch)
        here = ModelTeacher(tiny_causal_lm(seed=0, **TINY64)[0], trainer.passes).logprobs(got.batch)
        mask = got.batch.completion_mask > 0
        assert mask.sum() > 8
        # both fp32: vLLM's CPU kernels and torch's sum in other orders
        torch.testing.assert_close(served[mask], here[mask], atol=2e-4, rtol=0)
        assert (served[~mask] == 0).all()
        trainer.train()
        rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert sum("distill/reverse_kl" in r for r in rows) == 2
        trainer.close()
