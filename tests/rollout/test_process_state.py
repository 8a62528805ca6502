"""An in-process vLLM engine's changes to process-wide settings are put back: the NUMA memory policy
(read and set through the kernel) and torch.set_num_threads."""

from __future__ import annotations

import pytest
import torch

from grouprl.rollout.process_state import MPOL_DEFAULT, kept_process_state, memory_policy, set_memory_policy
from tests.helpers.rollout import assert_thread_count_can_change

MPOL_BIND = 2
readable = pytest.mark.skipif(memory_policy() is None, reason="no NUMA memory policy calls here (Linux x86_64/aarch64)")


@readable
def test_a_memory_policy_is_read_back_as_it_was_set():
    before = memory_policy()
    try:
        assert set_memory_policy((MPOL_BIND, (1,) + (0,) * 15))  # node 0 always exists
        mode, mask = memory_policy()
        assert mode & 0xFF == MPOL_BIND and mask[0] == 1
    finally:
        assert set_memory_policy(before)
    assert memory_policy() == before


@readable
def test_what_an_engine_changes_inside_is_put_back():
    """As vLLM's CPU worker does on start: memory bound to node 0, set_num_threads made a no-op."""
    before = memory_policy()
    with kept_process_state():
        set_memory_policy((MPOL_BIND, (1,) + (0,) * 15))
        torch.set_num_threads = lambda n: None
    assert memory_policy() == before
    assert_thread_count_can_change()


@readable
def test_the_default_policy_is_restored_without_a_mask():
    assert memory_policy()[0] == MPOL_DEFAULT or pytest.skip("this test process runs under a NUMA policy")
    with kept_process_state():
        set_memory_policy((MPOL_BIND, (1,) + (0,) * 15))
    assert memory_policy()[0] == MPOL_DEFAULT
