"""The repository's promises about itself: CI runs exactly the README's test command."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"Run the tests.*?```bash\n(.+?)\n```", readme, re.S)
    assert match, "README has no test command block"
    command = match.group(1).strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci_lines
    assert "set -euo pipefail" in ci_lines
    # set -e lets a failure inside a && list pass unless it is the last command: the next line must stop there
    assert ci_lines[ci_lines.index(command) + 1].startswith('status=$?; [ "$status" -eq 0 ] || exit "$status"')


def test_ci_also_runs_the_slow_suite():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ".venv/bin/pytest -m slow" in ci_lines
