"""The pure-math layer stays pure: no transformers, no file system, no upward imports."""

import ast
import pathlib
import subprocess
import sys

ALGOS = pathlib.Path(__file__).resolve().parents[1] / "src" / "grouprl" / "algos"
FILE_SYSTEM_MODULES = {"os", "pathlib", "io", "shutil", "tempfile", "glob", "json", "pickle", "safetensors"}
FILE_SYSTEM_CALLS = {"open", "save", "load"}


def test_importing_algos_pulls_in_no_transformers_and_no_other_grouprl_layer():
    code = (
        "import sys, grouprl.algos\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('transformers', 'safetensors', 'datasets', 'peft')]\n"
        "mine = sorted(m for m in sys.modules if m.startswith('grouprl.') and not m.startswith('grouprl.algos'))\n"
        "print(bad); print(mine)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "[]"
    assert out[1] == "['grouprl.registry']"


def test_algos_source_touches_no_file_system():
    for path in ALGOS.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            elif isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                assert name not in FILE_SYSTEM_CALLS, f"{path.name}:{node.lineno} calls {name}()"
                continue
            else:
                continue
            assert not names & FILE_SYSTEM_MODULES, f"{path.name}:{node.lineno} imports {names & FILE_SYSTEM_MODULES}"
            assert names <= {"torch", "grouprl", "math", "__future__", "dataclasses", "collections", "typing"}, (
                f"{path.name}:{node.lineno} imports {names}"
            )
