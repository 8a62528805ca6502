"""The ``agent`` key: built from an import path before any model loads, and refused, naming why, where it cannot
run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from grouprl.cli import main
from grouprl.cli.build import build_inputs
from grouprl.config import ConfigError, TrainConfig, load_config
from tests.helpers import own_agents

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_builds_with_its_agent(monkeypatch):
    monkeypatch.chdir(ROOT)
    inputs = build_inputs(load_config(TrainConfig, "examples/openai-agent/run.yaml"))
    assert inputs.agent.__name__ == "solve" and inputs.env is None and inputs.reward_fns == []
    assert (len(inputs.train_rows), len(inputs.eval_rows)) == (20, 4)
    assert {"prompt", "answer"} <= set(inputs.train_rows[0])


@pytest.mark.parametrize(("changes", "message"), [
    ({"agent": "no_function_here"}, "an import path is module:function"),
    ({"env": "calculator"}, "agent runs its own loop and tools through the chat endpoint: remove env"),
    ({"dynamic_sampling": True}, "dynamic_sampling is not available with an agent"),
    ({"agent_timeout": 0.0}, "agent_timeout=0.0 must be > 0"),
    ({"agent": "tests.helpers.own_agents:TOOLS"}, "is a list, not a function"),
])
def test_an_agent_that_cannot_run_is_refused_naming_why(changes, message):
    config = TrainConfig(task="arithmetic", agent="tests.helpers.own_agents:tool_agent", train_size=4)
    assert build_inputs(config).agent is own_agents.tool_agent
    with pytest.raises(ConfigError, match=message):
        build_inputs(replace(config, **changes))


def test_the_command_line_takes_agent(capsys):
    assert main(["train", "--task", "arithmetic", "--agent", "tests.helpers.own_agents:tool_agent",
                 "--agent_timeout", "30", "--print-config"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert (resolved["agent"], resolved["agent_timeout"]) == ("tests.helpers.own_agents:tool_agent", 30.0)
