"""Fixtures the rollout tests share."""

from __future__ import annotations

import pytest

from tests.helpers.rollout import PROMPTS, encode
from tests.helpers.vllm import LORA_DTYPE, lora_model, model_and_tok


@pytest.fixture(scope="module")
def ids(tok):
    """The test prompts' token ids (2 to 25 tokens each)."""
    return encode(tok, PROMPTS)


@pytest.fixture(scope="session")
def engine():
    from grouprl.rollout.vllm import VLLMSampler

    model, tok = model_and_tok()
    return VLLMSampler(model, tok, max_model_len=256, dtype="float32", max_rows=16)  # KV cache sized to 16 rows


@pytest.fixture(scope="session")
def lora_engine():
    from grouprl.rollout.vllm import VLLMSampler

    return VLLMSampler(lora_model(), model_and_tok()[1], max_model_len=256, dtype=LORA_DTYPE, kv_cache_gib=0.25,
                       lora_rank=4)
