"""The package's layers import in one direction and nothing imports in a circle (docs/architecture.md).

Every `import` in `trl_marl` counts, including imports inside functions (a lazy import that hides a cycle is still a
cycle); only `if TYPE_CHECKING:` blocks are skipped. A failure prints each offending import with its file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import trl_marl

# The layers, lowest first: a module may import its own layer and the layers below it (docs/architecture.md).
LAYERS = {
    0: ("algorithms", "accelerate_configs"),  # pure math (and package data)
    1: ("data_types",),  # what flows between the services and the trainers
    2: (  # services
        "utils",
        "models",
        "generation",
        "rollout",
        "rewards",
        "tasks",
        "environments",
        "plugins",
        "distributed",
        "checkpointing",
        "hub",
        "envs",
        "testing",
        "_moved",  # the old import paths (it warns through utils.deprecation)
    ),
    3: ("trainers", "classic"),  # trainers
    4: ("cli",),  # entry points
}
LAYER_OF = {top: layer for layer, tops in LAYERS.items() for top in tops}
LAYER_NAMES = {0: "math", 1: "data types", 2: "services", 3: "trainers", 4: "entry points"}


def _modules(package_dir: Path) -> dict[str, Path]:
    root = package_dir.parent
    mods = {}
    for path in sorted(package_dir.rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(package_dir: Path) -> dict[str, dict[str, int]]:
    """module -> {imported trl_marl module: line of the first such import}."""
    mods = _modules(package_dir)
    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        edges: dict[str, int] = {}
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    parts = name.split(".")[: None if is_pkg else -1]
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                # `from pkg import sub` imports the package and, when `sub` is a module, the module
                targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) == 1:
        return None  # the package root: `__version__` and the lazy public API
    return LAYER_OF.get(parts[1])


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports from a lower layer into a higher one (the package root may be imported for `__version__` only)."""
    bad = []
    for module, edges in sorted(graph.items()):
        low = _layer(module)
        for target, line in sorted(edges.items()):
            high = _layer(target)
            if low is None or high is None:
                continue
            if high > low:
                bad.append(f"{module} (line {line}, {LAYER_NAMES[low]}) imports {target} ({LAYER_NAMES[high]})")
    return bad


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each a list of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    members = set(cycle)
    edges = [f"  {a} -> {b} (line {line})" for a in cycle for b, line in graph[a].items() if b in members]
    return f"cycle of {len(cycle)} modules:\n" + "\n".join(edges)


PACKAGE_DIR = Path(trl_marl.__file__).parent


def test_no_import_cycles():
    graph = import_graph(PACKAGE_DIR)
    cycles = import_cycles(graph)
    assert not cycles, "\n".join(_describe(c, graph) for c in cycles)


def test_layers_import_downward_only():
    bad = upward_imports(import_graph(PACKAGE_DIR))
    assert not bad, "imports against the layers (docs/architecture.md):\n" + "\n".join(bad)


def test_every_top_level_package_has_a_layer():
    tops = {p.name for p in PACKAGE_DIR.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    tops |= {p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem != "__init__"}
    assert tops - set(LAYER_OF) == set(), "add the new package to LAYERS here and to docs/architecture.md"


def test_the_checks_see_function_level_imports_and_skip_type_checking(tmp_path):
    pkg = tmp_path / "trl_marl"
    (pkg / "algorithms").mkdir(parents=True)
    (pkg / "trainers").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "algorithms" / "__init__.py").write_text("")
    (pkg / "trainers" / "__init__.py").write_text("")
    (pkg / "algorithms" / "math.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trl_marl.trainers import base\n"
        "def f():\n    from ..trainers.base import T\n"
    )
    (pkg / "trainers" / "base.py").write_text("from trl_marl.algorithms.math import f\nT = 1\n")
    graph = import_graph(pkg)
    assert graph["trl_marl.algorithms.math"] == {"trl_marl.trainers.base": 5}
    assert import_cycles(graph) == [["trl_marl.algorithms.math", "trl_marl.trainers.base"]]
    assert upward_imports(graph) == [
        "trl_marl.algorithms.math (line 5, math) imports trl_marl.trainers.base (trainers)"
    ]
