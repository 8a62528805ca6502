"""The layers of docs/design.md hold: imports only point down (or along the few same-floor edges the
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
    "rollout": 2, "models": 2, "serve": 2,
    "run": 3, "trainer": 3, "control": 3, "report": 3,
    "config": 4, "cli": 4, "__main__": 4,
}
"""Each top-level module or package of grouprl and its floor (docs/design.md's layer table)."""
ALONG = {("algos", "registry"), ("registry", "errors"), ("types", "algos"), ("rewards", "data"), ("tasks", "rewards"),
         ("envs", "rewards"), ("envs", "data"), ("models", "rollout"), ("serve", "rollout"), ("trainer", "run"),
         ("control", "run"), ("report", "run"), ("cli", "config"), ("__main__", "cli")}
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


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(body: list[ast.stmt], deferred: bool = False):
    """(import node, whether it runs only when a function is called) for every import in ``body``;
    ``if TYPE_CHECKING:`` blocks never run, so they are left out."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, deferred
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _import_nodes(node.orelse, deferred)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _import_nodes(node.body, True)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, [])
                yield from _import_nodes([n for n in inner if isinstance(n, ast.AST)] if isinstance(inner, list)
                                         else [], deferred)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]) -> list[str]:
    """The modules of ``modules`` an import statement loads: ``from a import b`` is module a.b when there is
    one, else a name in a (its __init__); relative imports are resolved against ``module``."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".")[: None if is_package else -1]
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:  # a name inside a module: the module
            name = name.rpartition(".")[0]
        if name and name != module:
            out.append(name)
    return out


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, bool]]:
    """module -> {module it imports: True when every such import sits inside a function (deferred)}, from
    ``sources`` (module -> (its source, whether it is a package's __init__)), read as ASTs (nothing runs)."""
    graph = {}
    for module, (text, is_package) in sources.items():
        edges: dict[str, bool] = {}
        for node, deferred in _import_nodes(ast.parse(text).body):
            for target in _targets(node, module, is_package, set(sources)):
                edges[target] = edges.get(target, True) and deferred
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, bool]]) -> list[str] | None:
    """One cycle of ``graph`` as its path [a, b, ..., a], or None (depth-first, in sorted order, so the
    report is stable)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def cycle_problems(graph: dict[str, dict[str, bool]]) -> list[str]:
    """A cycle of module-level imports, else one that imports inside functions close, as a path that
    marks each deferred import (empty: no cycle)."""
    for what, edges in (("module-level imports", {m: {t: d for t, d in e.items() if not d} for m, e in graph.items()}),
                        ("imports (some inside functions, which only hide it)", graph)):
        cycle = find_cycle(edges)
        if cycle is not None:
            steps = [f"{b}{' (inside a function)' if graph[a][b] else ''}" for a, b in zip(cycle, cycle[1:])]
            return [f"{what} form a cycle: {' -> '.join([cycle[0], *steps])}"]
    return []


def test_no_module_imports_another_that_imports_it_back():
    """No cycle of imports in the package, module-level or closed by an import inside a function: a
    deferred import only hides a cycle (the modules still need each other)."""
    sources = {_module_name(p): (p.read_text(), p.name == "__init__.py") for p in SRC.rglob("*.py")}
    graph = import_graph(sources)
    assert "grouprl.config.run_checks" in graph["grouprl.config.convert"], "the graph misses a known import"
    assert cycle_problems(graph) == []


def test_a_cycle_is_reported_with_its_path():
    package = {"grouprl": ("", True), "grouprl.t": ("", True)}
    deferred = {**package, "grouprl.t.a": ("from grouprl.t import b\n", False),
                "grouprl.t.b": ("def f():\n    from grouprl.t.a import x\n", False)}
    assert cycle_problems(import_graph(deferred)) == [
        "imports (some inside functions, which only hide it) form a cycle: grouprl.t.a -> grouprl.t.b -> "
        "grouprl.t.a (inside a function)"]
    module_level = {**package, "grouprl.t.a": ("from . import b\n", False),
                    "grouprl.t.b": ("from .c import y\n", False), "grouprl.t.c": ("import grouprl.t.a\n", False)}
    assert cycle_problems(import_graph(module_level)) == [
        "module-level imports form a cycle: grouprl.t.a -> grouprl.t.b -> grouprl.t.c -> grouprl.t.a"]
    typing_only = {**package, "grouprl.t.a": ("from grouprl.t.b import y\n", False),
                   "grouprl.t.b": ("if TYPE_CHECKING:\n    from grouprl.t.a import x\n", False)}
    assert cycle_problems(import_graph(typing_only)) == []


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


def test_the_command_line_speaks_before_it_loads_transformers():
    """``grouprl train`` prints its first line once the config is resolved; the rollout engines (transformers,
    torch's compiler) load after it, so a newcomer sees the command start in seconds, not ten."""
    code = (
        "import sys, grouprl.cli, grouprl.config\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'transformers', 'vllm', 'peft', 'datasets'}))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["[]", "False"]


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
