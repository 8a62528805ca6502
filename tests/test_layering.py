"""The layers of DESIGN.md hold: imports only point down (or along the few same-floor edges the
diagram allows), nothing but the bottom layer sits loose at the package root, and the pure-math
layer stays pure: no transformers, no file system."""

import ast
import collections
import pathlib
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "grouprl"
ALGOS = SRC / "algos"
FILE_SYSTEM_MODULES = {"os", "pathlib", "io", "shutil", "tempfile", "glob", "json", "pickle", "safetensors"}
FILE_SYSTEM_CALLS = {"open", "save", "load"}

LAYERS = {
    "algos": 0, "types": 0, "registry": 0, "errors": 0, "__version__": 0,
    "data": 1, "rewards": 1, "tasks": 1, "envs": 1,
    "rollout": 2, "models": 2,
    "run": 3, "trainer": 3, "control": 3, "report": 3,
    "config": 4, "cli": 4, "__main__": 4,
}
"""Each top-level module or package of grouprl and its floor (DESIGN.md's layer diagram)."""
ALONG = {("algos", "registry"), ("registry", "errors"), ("types", "algos"), ("rewards", "data"), ("tasks", "rewards"),
         ("envs", "rewards"), ("envs", "data"), ("models", "rollout"), ("trainer", "run"), ("control", "run"),
         ("report", "run"), ("cli", "config"), ("__main__", "cli")}
"""Imports between packages of one floor, each one way only (the reverse would close a loop)."""


def _imports() -> collections.Counter:
    """(importing package, imported package) -> count, over every import in src/, functions included."""
    edges = collections.Counter()
    for path in SRC.rglob("*.py"):
        pkg = path.relative_to(SRC).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "grouprl" else [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "grouprl" and len(parts) > 1 and parts[1] != pkg:
                    edges[(pkg, parts[1])] += 1
    return edges


def test_every_import_points_down_the_layers():
    edges = _imports()
    assert edges, "no imports found: the test reads the wrong folder"
    unknown = {p for edge in edges for p in edge} - LAYERS.keys() - {"__init__"}
    assert not unknown, f"packages without a floor in LAYERS: {unknown}"
    up = [f"{a} (floor {LAYERS[a]}) -> {b} (floor {LAYERS[b]})" for a, b in edges if a != "__init__"
          and (LAYERS[b] > LAYERS[a] or (LAYERS[b] == LAYERS[a] and (a, b) not in ALONG))]
    assert not up, "imports against the layers:\n" + "\n".join(up)


def test_only_the_bottom_layer_sits_at_the_package_root():
    loose = {p.stem for p in SRC.glob("*.py")} - {"__init__", "__main__"}
    assert loose and all(LAYERS[name] == 0 for name in loose), loose


def test_importing_algos_pulls_in_no_transformers_and_no_other_grouprl_layer():
    code = (
        "import sys, grouprl.algos\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('transformers', 'safetensors', 'datasets', 'peft')]\n"
        "mine = sorted(m for m in sys.modules if m.startswith('grouprl.') and not m.startswith('grouprl.algos'))\n"
        "print(bad); print(mine)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "[]"
    assert out[1] == "['grouprl.errors', 'grouprl.registry']"


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
