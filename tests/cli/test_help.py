"""``grouprl train --help`` as a newcomer reads it: one screen with the keys of a usual run, then one section
(``--help sampling``) or every key (``--help all``) in sections (config.sections.SECTIONS), the built-in names
generated from their registries, the one statement of how values are written held to what the parser does,
and option texts that state decisions, not measurements."""

from __future__ import annotations

import argparse
import re

import pytest
import yaml

from grouprl.cli import EXAMPLE, build_parser, main
from grouprl.cli.help import summary
from grouprl.config import RewardModelConfig, TrainConfig, describe_fields
from grouprl.config.sections import OTHER, SECTION_NOTES, SECTIONS, USUAL_KEYS, section_order, short_name
from grouprl.rewards import REWARDS

HEADING = re.compile(r"^(\S[^:]*):$")
FIRST_SECTIONS = ["model and data", "rewards", "sampling", "algorithm"]
"""The order the sections start in (others may sit between the later ones)."""
LATER_SECTIONS = ["agents (environments and tools)", "precision and engines", "distribution (several processes)",
                  "run folder (logs, checkpoints)"]
FIRST_SCREEN_LINES, REFERENCE_LINES = 60, 600
CITATIONS = re.compile(r"benchmarks/|\d ?s a step|\bx fp32|tokens/s|measured|Xeon|EPYC|\bZen\b|\b\d+(\.\d+)?x\b")
"""What marks a measurement in an option text: benchmark paths, timings, speedups, machine names. Figures live
in the docs (docs/performance.md); an option states the decision."""


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch):
    """The help wraps to the terminal; line counts are held at a common 80 columns."""
    monkeypatch.setenv("COLUMNS", "80")


def help_of(capsys, command: str, *section: str) -> str:
    assert main([command, "--help", *section]) == 0
    return capsys.readouterr().out


def headings(text: str) -> list[str]:
    """Section titles: a line of its own ending in a colon, after a blank line."""
    lines = text.splitlines()
    return [m.group(1) for before, line in zip(["", *lines], lines) if not before and (m := HEADING.match(line))]


def option_block(text: str, option: str) -> str:
    """The help of one ``--option``: its line and the indented lines under it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f"{option} "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" " * 6)), len(lines))
    return " ".join(" ".join(lines[start:end]).split())


def options_in(text: str) -> set[str]:
    return set(re.findall(r"^  (--[\w.-]+)", text, flags=re.M))


def fields() -> list[str]:
    return [r.key for r in describe_fields(TrainConfig) if not r.is_section]


# --------------------------------------------------------------------------- the first screen


def test_the_first_screen_shows_a_usual_runs_keys_and_how_to_see_more(capsys):
    text = help_of(capsys, "train")
    assert len(text.splitlines()) <= FIRST_SCREEN_LINES, f"{len(text.splitlines())} lines:\n{text}"
    shown = options_in(text)
    for key in ("model", "dataset", "task", "reward_functions", "total_steps", "prompts_per_step", "group_size",
                "max_new_tokens", "lr", "output_dir", "loggers", "resume_from"):
        assert f"--{key}" in shown, key
    assert "--config" in shown and "--temperature" not in shown and "--rollout_is" not in shown
    flat = " ".join(text.split())
    assert "grouprl train --help sampling" in flat and "grouprl train --help all" in flat
    for title in dict.fromkeys(SECTIONS.values()):  # each section by the name --help takes
        assert re.search(rf"^  {short_name(title)} +\w", text, flags=re.M), title


def test_each_usual_key_has_a_one_line_text_from_its_docstring(capsys):
    text = help_of(capsys, "train")
    docs = {r.key: r.doc for r in describe_fields(TrainConfig)}
    for key in USUAL_KEYS:
        first = summary(docs[key])
        assert 10 <= len(first) <= 100, f"{key}: the first sentence of its docstring is the one-line text: {first!r}"
        assert " ".join(first.split()[:4]) in " ".join(option_block_first_screen(text, f"--{key}").split())


def option_block_first_screen(text: str, option: str) -> str:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {option} "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" " * 24)), len(lines))
    return " ".join(lines[start:end])


def test_a_sentence_ends_at_its_full_stop_not_at_an_abbreviations():
    assert summary("Options of the task, e.g. {digits: 2}. More.") == "Options of the task, e.g. {digits: 2}."
    assert summary("Only the top q (Wang et al. 2025). TRL's default.") == "Only the top q (Wang et al. 2025)."
    assert summary("A list: tensorboard, wandb. trackio is local.") == "A list: tensorboard, wandb."
    assert summary("One sentence without a stop") == "One sentence without a stop"


# --------------------------------------------------------------------------- every key, and one section


def test_help_all_lists_every_key_in_at_most_600_lines(capsys):
    text = help_of(capsys, "train", "all")
    assert len(text.splitlines()) <= REFERENCE_LINES, len(text.splitlines())
    missing = {f"--{key}" for key in fields()} - options_in(text)
    assert not missing, missing
    assert {"--overwrite", "--nproc", "--config", "--print-config", "--debug"} <= options_in(text)
    for key in ("group_size", "beta", "rollout_is"):  # type, default and the whole docstring
        row = next(r for r in describe_fields(TrainConfig) if r.key == key)
        block = option_block(text, f"--{key}")
        assert f"(default: {row.default})" in block and " ".join(row.doc.split()) in block, block


def test_train_help_all_opens_with_model_and_data_then_rewards_sampling_algorithm(capsys):
    text = help_of(capsys, "train", "all")
    found = headings(text)
    assert found[:5] == ["options", *FIRST_SECTIONS], found
    assert [h for h in found if h in LATER_SECTIONS] == LATER_SECTIONS, found
    assert OTHER not in found, f"fields without a section: {option_block(text, '--' + found[-1])}"
    lines = text.splitlines()
    where = {opt: next(i for i, line in enumerate(lines) if line.lstrip().startswith(opt + " "))
             for opt in ("--model", "--task", "--dataset", "--reward_functions", "--group_size", "--algo", "--lr")}
    assert where["--model"] < 25, f"--model is on line {where['--model'] + 1} of train --help all"
    order = ["--model", "--task", "--dataset", "--reward_functions", "--group_size", "--algo", "--lr"]
    assert sorted(order, key=where.get) == order, where
    # the command's own options sit in the sections they belong to
    run_folder = text.split("\nrun folder (logs, checkpoints):\n")[1]
    assert "--overwrite" in run_folder.split("\n\n")[0]
    distribution = text.split("\ndistribution (several processes):\n")[1]
    assert "--nproc N" in distribution.split("\n\n")[0]


@pytest.mark.parametrize("name, title", [("sampling", "sampling"), ("ppo", "ppo (critic and GAE)"),
                                         ("run", "run folder (logs, checkpoints)"), ("lr", "optimizer"),
                                         ("Precision and engines", "precision and engines")])
def test_help_of_one_section_shows_its_keys_alone(capsys, name, title):
    text = help_of(capsys, "train", name)
    assert headings(text) == [title], headings(text)
    expected = {f"--{key}" for key, section in SECTIONS.items() if section == title}
    assert expected <= options_in(text) and not options_in(text) - expected - {"--overwrite", "--nproc"}
    if title in SECTION_NOTES:
        assert " ".join(SECTION_NOTES[title].split()) in " ".join(text.split())


def test_an_unknown_section_is_refused_naming_the_sections(capsys):
    assert main(["train", "--help", "sampler"]) == 2
    err = capsys.readouterr().err
    assert "no help section 'sampler'" in err, err
    for title in dict.fromkeys(SECTIONS.values()):
        assert short_name(title) in err, (title, err)


def test_section_names_are_distinct_and_every_field_has_a_section():
    titles = list(dict.fromkeys(SECTIONS.values()))
    names = [short_name(t) for t in titles]
    assert len(set(names)) == len(names), names
    homeless = [k for k in fields() if k not in SECTIONS]
    assert not homeless, f"fields without a --help section (add them to grouprl.config.sections.SECTIONS): {homeless}"
    stale = sorted(set(SECTIONS) - set(fields()))
    assert not stale, f"SECTIONS names keys that are no config field: {stale}"
    assert set(SECTION_NOTES) <= set(SECTIONS.values()), set(SECTION_NOTES) - set(SECTIONS.values())
    assert set(USUAL_KEYS) <= set(SECTIONS)


def test_section_order_follows_the_map_and_keeps_unplaced_fields_last():
    sections = {"b": "two", "a": "one", "c": "two"}
    assert section_order(["a", "zz", "c", "b"], sections) == [("two", ["b", "c"]), ("one", ["a"]), (OTHER, ["zz"])]


def test_reward_functions_help_lists_every_built_in_from_the_registry(capsys, monkeypatch):
    block = option_block(help_of(capsys, "train", "rewards"), "--reward_functions")
    assert REWARDS.names() and all(name in block for name in REWARDS.names()), block
    assert "code_execution" in block
    # generated, not copied: a reward registered now shows up in the next --help
    monkeypatch.setitem(REWARDS._entries, "brand_new_reward", lambda: None)
    assert "brand_new_reward" in option_block(help_of(capsys, "train", "rewards"), "--reward_functions")


# --------------------------------------------------------------------------- what option texts say


def subcommands() -> dict[str, argparse.ArgumentParser]:
    actions = build_parser()._actions  # argparse keeps its subcommands there
    return next(a for a in actions if isinstance(a, argparse._SubParsersAction)).choices


def test_no_option_text_cites_a_measurement():
    texts = {f"{cls.__name__}.{r.key}": r.doc for cls in (TrainConfig, RewardModelConfig) for r in describe_fields(cls)}
    for name, parser in subcommands().items():
        texts.update({f"grouprl {name} {a.option_strings}": a.help or "" for a in parser._actions})
    cited = {where: m.group(0) for where, text in texts.items() if (m := CITATIONS.search(" ".join(text.split())))}
    assert not cited, f"option texts that cite measurements (say the decision; figures go to the docs): {cited}"
    assert all(CITATIONS.search(text) for text in ("1.43x the eager engine", "20-26 s a step", "on a Xeon"))
    assert not CITATIONS.search("frozen") and not CITATIONS.search("its advantage plus a step-level one")


def test_every_command_still_answers_help(capsys):
    for name in subcommands():
        assert main([name, "--help"]) == 0, name
        assert capsys.readouterr().out.startswith(f"usage: grouprl {name}"), name


# --------------------------------------------------------------------------- values and the example


def resolved(capsys, *argv: str) -> dict:
    code = main(["train", *argv, "--print-config"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return yaml.safe_load(out)


def test_what_the_help_says_about_values_is_what_the_parser_does(capsys):
    for section in ((), ("all",)):
        flat = " ".join(help_of(capsys, "train", *section).split())
        assert flat.count("a,b,c or YAML's '[a, b]' (quoted), never space-separated") == 1, "said once"
        assert flat.count("a list is one argument") == 1
    for spelling in (["exact_match,format"], ["[exact_match, format]"], ["exact_match, format"]):
        assert resolved(capsys, "--reward_functions", *spelling)["reward_functions"] == ["exact_match", "format"]
    assert resolved(capsys, "--task_options", "{digits: 2}")["task_options"] == {"digits": 2}
    assert resolved(capsys, "--no-progress")["progress"] is False
    assert resolved(capsys, "--progress", "false")["progress"] is False
    assert resolved(capsys, "--vllm_compile")["vllm_compile"] is True
    assert resolved(capsys, "--eval_size", "3", "--eval_size", "none")["eval_size"] is None
    assert resolved(capsys, "--eval_size", "3", "--eval_size", "")["eval_size"] is None
    # a space-separated list is refused, and the message says how to write one
    assert main(["train", "--reward_functions", "exact_match", "format", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "Unexpected command-line argument 'format'" in err and "a,b,c or '[a, b]'" in err, err


def test_the_example_in_train_help_resolves(capsys):
    for section in ((), ("all",)):
        assert " ".join(EXAMPLE.split()) in " ".join(help_of(capsys, "train", *section).split())
    argv = EXAMPLE.split("grouprl train ", 1)[1].split()
    config = resolved(capsys, *argv)
    assert config["model"] == "tiny" and config["reward_functions"] == ["exact_match", "format"]


def test_demo_help_is_sectioned_as_train_and_eval_lists_its_keys(capsys):
    text = help_of(capsys, "demo")
    assert len(text.splitlines()) <= FIRST_SCREEN_LINES and {"--quick", "--agent", "--model"} <= options_in(text)
    found = headings(help_of(capsys, "demo", "all"))
    assert found[:3] == ["options", "model and data", "rewards"], found
    found = headings(help_of(capsys, "eval"))
    assert found[:3] == ["options", "model and data", "rewards"], found
    assert "optimizer" not in found and "ppo (critic and GAE)" not in found, found  # only eval's keys
