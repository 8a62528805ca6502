"""The README's and the docs' promises: the docs' config reference matches the code, the two commands come
first, every command line the README shows parses, its Python example runs (on a tiny model), and neither
cites a commit or a file that is not there."""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path

from grouprl.cli import main
from grouprl.cli.demo import DEMO
from grouprl.config import TrainConfig, from_dict, save_yaml
from grouprl.config.reference_page import check_page

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# 7 to 40 hex digits with at least one letter and one digit: an abbreviated or full commit hash
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
# a repository path in backquotes; `grouprl/...` is short for src/grouprl/...
CITED_PATH = re.compile(r"`((?:benchmarks|examples|src|tests|docs|grouprl)/[^`\s<>*]*)`")


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_config_reference_is_in_sync_with_the_code():
    assert check_page(ROOT) == ""


def test_readme_is_an_overview_not_a_manual():
    lines = README.read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move detail into docs/ (the limit is 250)"


def test_no_commit_hashes_in_the_readme_or_the_docs():
    found = [f"{path.relative_to(ROOT)}:{number}: {match}" for path in [README, *DOCS]
             for number, line in enumerate(path.read_text().splitlines(), 1) for match in COMMIT.findall(line)]
    assert not found, "cite a results folder instead of a commit:\n" + "\n".join(found)


def test_every_file_the_readme_and_docs_cite_exists():
    """What the docs cite survives pruning of benchmarks/results (and a rename is caught)."""
    missing = []
    for path in [README, *DOCS]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for cited in CITED_PATH.findall(line):
                target = ROOT / ("src/" + cited if cited.startswith("grouprl/") else cited)
                if not target.exists():
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {cited}")
    assert len(DOCS) >= 10 and not missing, "\n".join(missing) or f"only {len(DOCS)} pages in docs/"


def test_the_docs_show_the_readme_test_command():
    readme_command = code_blocks(README.read_text(), "bash")[1]
    assert readme_command in code_blocks((ROOT / "docs" / "index.md").read_text(), "bash")


def test_install_and_demo_come_first_then_the_test_command():
    bash = code_blocks(README.read_text(), "bash")
    assert "pip install" in bash[0] and bash[0].strip().endswith("grouprl demo")
    assert bash[1].strip().endswith(".venv/bin/pytest")  # .ci/run runs exactly this (tests/test_repo.py)


def test_every_command_line_in_the_readme_parses(tmp_path, monkeypatch, capsys):
    """Each `grouprl ...` line of "The command line" resolves its config (nothing is loaded)."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # example paths are relative to the repository root
    save_yaml(from_dict(TrainConfig, DEMO), tmp_path / "runs" / "demo" / "config.yaml")  # as the demo leaves it
    monkeypatch.chdir(tmp_path)
    block = code_blocks(section(README.read_text(), "The command line"), "bash")[0]
    commands = [shlex.split(line.split("#")[0]) for line in block.splitlines() if line.startswith("grouprl ")]
    assert len(commands) >= 6
    for argv in commands:
        if argv[1] == "report" or "--help" in argv:
            continue  # no config to resolve; the report command has its own test
        code = main([*argv[1:], "--print-config"])
        assert code == 0, (argv, capsys.readouterr().err)


def test_python_example_runs_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    """The API example as printed, with the bundled model swapped for a tiny one and a short run."""
    code = code_blocks(section(README.read_text(), "Python API"), "python")[0]
    swaps = {
        "from grouprl.models import load_policy": "from grouprl.models import load_policy, tiny_causal_lm",
        'load_policy("smollm2-135m")': "tiny_causal_lm()",
        "total_steps=30": "total_steps=1, progress=False, prompts_per_step=2, group_size=4",
        'task.rows("eval", 32, seed=0)': 'task.rows("eval", 4, seed=0)',
        'output_dir="runs/api"': f"output_dir={str(tmp_path / 'api')!r}",
    }
    for old, new in swaps.items():
        assert old in code, f"the README example changed; update this test's substitution for {old!r}"
        code = code.replace(old, new)
    script = tmp_path / "example.py"
    script.write_text(code)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"[\d.]+ -> [\d.]+", printed)
    assert (tmp_path / "api" / "summary.json").exists()

