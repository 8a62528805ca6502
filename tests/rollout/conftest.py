"""Fixtures the rollout tests share."""

from __future__ import annotations

import pytest

from tests.helpers.rollout import PROMPTS, encode


@pytest.fixture(scope="module")
def ids(tok):
    """The test prompts' token ids (2 to 25 tokens each)."""
    return encode(tok, PROMPTS)
