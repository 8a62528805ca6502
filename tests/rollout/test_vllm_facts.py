"""What the installed vLLM can serve is asked once per installed vLLM (grouprl.rollout.vllm_facts): a later start
answers from the cache, without importing vLLM; another install asks again; a cache that cannot be read or
written is asked around."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from grouprl.rollout import vllm_facts
from grouprl.rollout.vllm_facts import fact


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    key = ["vllm 1 at /a"]
    monkeypatch.setattr(vllm_facts, "installed_key", lambda: key[0])
    return tmp_path / "grouprl" / vllm_facts.FILE, key


def counted(value):
    asked = []

    def ask():
        asked.append(1)
        return value

    return ask, asked


def test_a_fact_is_asked_once_per_installed_vllm(cache):
    path, key = cache
    ask, asked = counted([16, 64])
    assert fact("sizes", ask) == [16, 64] and fact("sizes", ask) == [16, 64] and len(asked) == 1
    other, other_asked = counted(["LlamaForCausalLM"])
    assert fact("archs", other) == ["LlamaForCausalLM"] and len(other_asked) == 1
    assert json.loads(path.read_text()) == {"key": key[0], "facts": {"sizes": [16, 64], "archs": ["LlamaForCausalLM"]}}
    key[0] = "vllm 2 at /a"  # reinstalled: the old answers are not the new package's
    assert fact("sizes", ask) == [16, 64] and len(asked) == 2
    assert json.loads(path.read_text())["facts"] == {"sizes": [16, 64]}


def test_a_torn_or_unwritable_cache_is_asked_around(cache, tmp_path, monkeypatch):
    path, _ = cache
    path.parent.mkdir(parents=True)
    path.write_text('{"key": "vllm 1 at /a", "facts": {"si')  # a start killed mid-write by another tool
    ask, asked = counted([32])
    assert fact("sizes", ask) == [32] and len(asked) == 1
    assert fact("sizes", ask) == [32] and len(asked) == 1  # and written whole again
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # no folder can be made there
    assert fact("sizes", ask) == [32] and len(asked) == 2 and not list(tmp_path.glob("**/.vllm-facts*"))


def test_no_vllm_is_asked_each_time_without_a_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(vllm_facts, "installed_key", lambda: None)
    ask, asked = counted(None)
    fact("archs", ask), fact("archs", ask)
    assert len(asked) == 2 and not (tmp_path / "grouprl").exists()


@pytest.mark.slow  # imports vLLM, then starts a Python process of its own
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM's CPU build")
def test_a_later_start_learns_that_vllm_cannot_serve_the_tiny_model_without_importing_vllm(tmp_path, monkeypatch):
    from grouprl.models import tiny_causal_lm
    from grouprl.rollout.engines import model_problem

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    said = model_problem(tiny_causal_lm()[0])  # asks vLLM (this process may have imported it already)
    assert said is not None and "head sizes" in said and (tmp_path / "grouprl" / vllm_facts.FILE).exists()
    code = ("import sys; from grouprl.models import tiny_causal_lm; from grouprl.rollout.engines import model_problem; "
            "print(model_problem(tiny_causal_lm()[0])); print('vllm' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [said, "False"]
