"""Shared fixtures."""

import pytest
import torch

# Test models are tiny: their matmuls are latency-bound, and intra-op threads only add barrier
# waits (badly so when other processes share the cores). One thread is several times faster here.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the bundled SmolLM2-135M-Instruct, loaded once per test session.

    On a machine without the cache the first load converts the GGUF file (~30-50 s, once; the
    cache then serves every later run in about half a second)."""
    from grouprl.models import load_policy

    return load_policy("smollm2-135m")
