"""``grouprl train --help`` as a newcomer reads it: options in sections (config.sections.SECTIONS), the keys
to set first at the top, the built-in names generated from their registries, and the one statement of
how values are written, held to what the parser does."""

from __future__ import annotations

import re

import pytest
import yaml

from grouprl.cli import EXAMPLE, main
from grouprl.config import TrainConfig, describe_fields
from grouprl.config.sections import OTHER, SECTION_NOTES, SECTIONS, section_order
from grouprl.rewards import REWARDS

HEADING = re.compile(r"^(\S[^:]*):$")
FIRST_SECTIONS = ["model and data", "rewards", "sampling", "algorithm"]
"""The order the sections start in (others may sit between the later ones)."""
LATER_SECTIONS = ["agents (environments and tools)", "precision and engines", "distribution (several processes)",
                  "run folder (logs, checkpoints)"]


def help_of(capsys, command: str) -> str:
    assert main([command, "--help"]) == 0
    return capsys.readouterr().out


def headings(text: str) -> list[str]:
    """Section titles: a line of its own ending in a colon, after a blank line."""
    lines = text.splitlines()
    return [m.group(1) for before, line in zip(["", *lines], lines) if not before and (m := HEADING.match(line))]


def option_block(text: str, option: str) -> str:
    """The help of one ``--option``: its line and the indented lines under it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f"{option} "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" " * 20)), len(lines))
    return " ".join(" ".join(lines[start:end]).split())


def test_every_config_field_has_a_section_and_every_section_entry_a_field():
    fields = [r.key for r in describe_fields(TrainConfig) if not r.is_section]
    homeless = [k for k in fields if k not in SECTIONS]
    assert not homeless, f"fields without a --help section (add them to grouprl.config.sections.SECTIONS): {homeless}"
    stale = sorted(set(SECTIONS) - set(fields))
    assert not stale, f"SECTIONS names keys that are no config field: {stale}"
    assert set(SECTION_NOTES) <= set(SECTIONS.values()), set(SECTION_NOTES) - set(SECTIONS.values())


def test_section_order_follows_the_map_and_keeps_unplaced_fields_last():
    sections = {"b": "two", "a": "one", "c": "two"}
    assert section_order(["a", "zz", "c", "b"], sections) == [("two", ["b", "c"]), ("one", ["a"]), (OTHER, ["zz"])]


def test_train_help_opens_with_model_and_data_then_rewards_sampling_algorithm(capsys):
    text = help_of(capsys, "train")
    found = headings(text)
    assert found[:5] == ["options", *FIRST_SECTIONS], found
    assert [h for h in found if h in LATER_SECTIONS] == LATER_SECTIONS, found
    assert OTHER not in found, f"fields without a section: {option_block(text, '--' + found[-1])}"
    lines = text.splitlines()
    where = {opt: next(i for i, line in enumerate(lines) if line.lstrip().startswith(opt + " "))
             for opt in ("--model", "--task", "--dataset", "--reward_functions", "--group_size", "--algo", "--lr")}
    assert where["--model"] < 25, f"--model is on line {where['--model'] + 1} of train --help"
    order = ["--model", "--task", "--dataset", "--reward_functions", "--group_size", "--algo", "--lr"]
    assert sorted(order, key=where.get) == order, where
    # the command's own options sit in the sections they belong to
    run_folder = text.split("\nrun folder (logs, checkpoints):\n")[1]
    assert "--overwrite" in run_folder.split("\n\n")[0]
    distribution = text.split("\ndistribution (several processes):\n")[1]
    assert "--nproc N" in distribution.split("\n\n")[0]


def test_reward_functions_help_lists_every_built_in_from_the_registry(capsys, monkeypatch):
    block = option_block(help_of(capsys, "train"), "--reward_functions")
    assert REWARDS.names() and all(name in block for name in REWARDS.names()), block
    assert "code_execution" in block
    # generated, not copied: a reward registered now shows up in the next --help
    monkeypatch.setitem(REWARDS._entries, "brand_new_reward", lambda: None)
    assert "brand_new_reward" in option_block(help_of(capsys, "train"), "--reward_functions")


def resolved(capsys, *argv: str) -> dict:
    code = main(["train", *argv, "--print-config"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return yaml.safe_load(out)


def test_what_the_help_says_about_values_is_what_the_parser_does(capsys):
    text = help_of(capsys, "train")
    flat = " ".join(text.split())
    assert flat.count("a,b,c or YAML's '[a, b]' (quoted), never space-separated") == 1, "said once, in the description"
    assert flat.count("a list is one argument") == 1
    for spelling in (["exact_match,format"], ["[exact_match, format]"], ["exact_match, format"]):
        assert resolved(capsys, "--reward_functions", *spelling)["reward_functions"] == ["exact_match", "format"]
    assert resolved(capsys, "--task_options", "{digits: 2}")["task_options"] == {"digits": 2}
    assert resolved(capsys, "--no-progress")["progress"] is False
    assert resolved(capsys, "--progress", "false")["progress"] is False
    assert resolved(capsys, "--tensorboard")["tensorboard"] is True
    assert resolved(capsys, "--eval_size", "3", "--eval_size", "none")["eval_size"] is None
    assert resolved(capsys, "--eval_size", "3", "--eval_size", "")["eval_size"] is None
    # a space-separated list is refused, and the message says how to write one
    assert main(["train", "--reward_functions", "exact_match", "format", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "Unexpected command-line argument 'format'" in err and "a,b,c or '[a, b]'" in err, err


def test_the_example_in_train_help_resolves(capsys):
    text = " ".join(help_of(capsys, "train").split())
    assert " ".join(EXAMPLE.split()) in text
    argv = EXAMPLE.split("grouprl train ", 1)[1].split()
    config = resolved(capsys, *argv)
    assert config["model"] == "tiny" and config["reward_functions"] == ["exact_match", "format"]


@pytest.mark.parametrize("command", ["demo", "eval"])
def test_demo_and_eval_help_use_the_same_sections(capsys, command):
    found = headings(help_of(capsys, command))
    assert found[:3] == ["options", "model and data", "rewards"], found
    if command == "eval":  # only its keys, so sections without one are left out
        assert "optimizer" not in found and "ppo (critic and GAE)" not in found, found
