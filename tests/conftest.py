"""Shared fixtures, and a watchdog on the test process's exit."""

import faulthandler
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.deprecations import deprecated_calls
from tests.helpers.rollout import make_tokenizer


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test fails when grouprl's code calls a library's deprecated API in it (:mod:`tests.helpers.deprecations`:
    the warning's file is the library's, so pyproject.toml's filters by module cannot see whose call it was)."""
    with deprecated_calls() as found:
        result = yield
    if found:
        pytest.fail("grouprl calls a deprecated API:\n" + "\n".join(dict.fromkeys(found)), pytrace=False)
    return result


@pytest.fixture(autouse=True)
def one_thread():
    """Every test runs on one intra-op thread, and leaves it so for the next (a trainer or a test may
    set its own). Test models are tiny: their matmuls are latency-bound, and extra threads only add
    barrier waits (badly so when other processes share the cores): one thread is several times faster."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tok():
    """The character-level test tokenizer of :mod:`tests.helpers.rollout`."""
    return make_tokenizer()


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the bundled SmolLM2-135M-Instruct, loaded once per test session.

    On a machine without the cache the first load converts the GGUF file (~30-50 s, once; the
    cache then serves every later run in about half a second)."""
    from grouprl.models import load_policy

    return load_policy("smollm2-135m")


EXIT_GRACE_S = 120


def pytest_unconfigure(config):
    """A thread left waiting by a test keeps the process from exiting after the summary, and CI from ever
    finishing: if the process still runs ``EXIT_GRACE_S`` after the session, print every thread's stack
    and exit with status 1. Armed only in pytest's own process (``pytest``, ``python -m pytest``), never in a
    program that runs pytest inside itself and goes on afterwards."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if Path(sys.argv[0]).name in ("pytest", "py.test") or (spec is not None and spec.name == "pytest.__main__"):
        faulthandler.dump_traceback_later(EXIT_GRACE_S, exit=True, file=sys.__stderr__)
