"""The layers go one way (docs/architecture.md): every import, at the top of a module or inside a
function, goes to the module's own layer or one below; no modules import each other, however
long the way round; and the layers below the services know none by name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from statefleet.plugins import load_plugins

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("framework", "backup", "services", "statefleet")
# Lowest first; a module belongs to the layer of its longest matching prefix.
LAYERS = (
    ("Kubernetes core", "framework.kube"),
    ("rollouts", "framework.rollout"),
    ("platform framework", "framework"),
    ("backup engine", "backup"),
    ("services", "services"),
    ("composition root", "statefleet"),
)
SERVICE_NEUTRAL = ("framework", "backup")

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The names an import statement reaches, as dotted paths (a module, or a name inside one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join([*base, node.module] if node.module else base)
    else:
        prefix = node.module or ""
    return [f"{prefix}.{alias.name}" for alias in node.names]


def import_graph(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> Graph:
    """Module -> the modules of ours it imports, wherever in the module the import is."""
    files = {module_name(p, root): p for package in packages for p in (root / package).rglob("*.py")}
    graph: Graph = {}
    for module, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in imported(node, module, path.name == "__init__.py"):
                while name and name not in files:  # `from a.b import c`: c is a module or a name in a.b
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def layer_of(module: str) -> int:
    matches = [
        (len(prefix), index)
        for index, (_, prefix) in enumerate(LAYERS)
        if module == prefix or module.startswith(prefix + ".")
    ]
    if not matches:
        raise ValueError(f"{module} is in no layer")
    return max(matches)[1]


def upward_edges(graph: Graph) -> list[str]:
    return [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]


def cycles(graph: Graph) -> list[list[str]]:
    """The groups of modules that import each other, directly or the long way round (Tarjan's
    strongly connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_every_import_goes_to_its_own_layer_or_one_below() -> None:
    assert upward_edges(import_graph()) == []


def test_no_modules_import_each_other() -> None:
    assert cycles(import_graph()) == []


def test_the_layers_below_the_services_know_none_by_name() -> None:
    names = {name.lower() for plugin in load_plugins() for name in (plugin.service, plugin.kind)}
    pattern = re.compile("|".join(sorted(map(re.escape, names))), re.IGNORECASE)
    mentions = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for package in SERVICE_NEUTRAL
        for path in sorted((REPO / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert mentions == []


# The checks themselves, on made-up graphs: each finds what it is for.


def test_an_upward_edge_is_found_even_one_layer_up() -> None:
    graph = {"framework.kube.api": {"framework.rollout.plan"}, "framework.rollout.plan": set()}
    assert upward_edges(graph) == [
        "framework.kube.api (Kubernetes core) imports framework.rollout.plan (rollouts)"
    ]
    assert upward_edges({"services.x": {"backup.run", "framework.kube.api"}}) == []


def test_a_cycle_is_found_however_long_the_way_round() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_and_relative_ones_count(tmp_path: Path) -> None:
    package = tmp_path / "framework"
    (package / "kube").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "kube" / "__init__.py").write_text("")
    (package / "kube" / "api.py").write_text("def f():\n    from framework.rollout import plan\n")
    (package / "rollout").mkdir()
    (package / "rollout" / "__init__.py").write_text("")
    (package / "rollout" / "plan.py").write_text("from ..kube.api import f\n")
    graph = import_graph(tmp_path, ("framework",))
    assert graph["framework.kube.api"] == {"framework.rollout.plan"}
    assert graph["framework.rollout.plan"] == {"framework.kube.api"}
    assert cycles(graph) == [["framework.kube.api", "framework.rollout.plan"]]
