"""The repository's promises about itself: CI runs exactly the README's test command, and builds the docs."""

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


def test_ci_also_runs_the_slow_suite_and_says_how_long_each_part_took():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    slow = ci_lines.index(".venv/bin/pytest -m slow")
    assert ci_lines[slow - 1] == "step=$SECONDS" and ci_lines[slow + 1].startswith('say "the slow suite"')
    assert ci_lines[-1] == 'say "the whole run" "$started"'


def test_ci_builds_the_docs_strictly_after_the_tests():
    """A broken link or a missing page fails CI (mkdocs --strict), after the test command and the slow suite."""
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    docs = [i for i, line in enumerate(ci_lines) if "mkdocs build --strict" in line]
    assert len(docs) == 1 and '.venv/bin/pip install -e ".[docs]"' in ci_lines[docs[0]]
    assert docs[0] > ci_lines.index(".venv/bin/pytest -m slow")
    assert "docs = [" in (ROOT / "pyproject.toml").read_text() and (ROOT / "mkdocs.yml").exists()


def test_no_assert_close_message_hides_the_size_of_the_difference():
    """``assert_close(..., msg="name")`` replaces torch's report (how far apart, where, the tolerance) with the
    name alone; a callable keeps it (``msg=named(name)``, tests/helpers/messages.py)."""
    import ast

    hiding = []
    for path in sorted(pathlib.Path(__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
                    "assert_close":
                hiding += [f"{path}:{node.lineno}" for kw in node.keywords
                           if kw.arg == "msg" and not isinstance(kw.value, ast.Lambda)
                           and not (isinstance(kw.value, ast.Call) and getattr(kw.value.func, "id", "") == "named")]
    assert not hiding, f"assert_close with a message that replaces its report: {hiding}"
