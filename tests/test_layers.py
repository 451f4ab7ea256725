"""The layer rule of the package (docs/ARCHITECTURE.md, "Layers"): a module imports from its own
top-level package and from lower layers only, never upwards and never sideways into another
package of its own layer; and the graph between packages has no cycle.

Every `import` / `from ... import` statement of every module under `hotstep_ray/` counts, at any
depth: module level, inside functions, under `if TYPE_CHECKING:`. Imports by string
(`importlib.import_module`, the studio's `module:function` stage entries) are not statements and
are not checked here.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "hotstep_ray"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
VERSION = "__version__"  # `hotstep_ray/__init__.py`: the version string, nothing else

# Each top-level package (or module) of hotstep_ray and its layer, bottom to top. Calibration and
# Ray Train/Serve compose the recipes below them, never the other way round: training holds the
# held-out loss, and "train, then calibrate" lives in `calibration/after_train.py`.
LAYERS: dict[str, int] = {
    "core": 0,  # contracts, events, storage, layout, jobs
    "audio": 1,
    "models": 1,
    "distributed": 1,  # start/join Ray, RayMap, Ray Train's results folder
    "report_plot": 1,
    "bench_matrix": 1,
    VERSION: 1,
    "dataset": 2,
    "labeling": 3,
    "preprocess": 3,
    "training": 4,
    "audition": 5,  # serves and renders trained adapters
    "calibration": 6,  # evaluates trained adapters through audition; train-then-calibrate
    "mm3": 6,
    "studio": 7,
    "main_job": 7,
    "bench_e2e": 8,  # times `make`: runs the main job (or its command) and reads its timeline
    "cli": 9,
}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module's top-level package
    target: str  # the imported one's
    where: str  # path:line


def package_of(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    if len(parts) > 1:
        return parts[0]
    return VERSION if parts[0] == "__init__.py" else parts[0].removesuffix(".py")


def module_name(path: Path) -> list[str]:
    parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_names(node: ast.Import | ast.ImportFrom, path: Path) -> list[str]:
    """The dotted module names a statement imports (`from hotstep_ray import x` names
    `hotstep_ray.x`; relative imports resolved against `path`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    module = node.module or ""
    if node.level:
        here = module_name(path)
        package = here if path.name == "__init__.py" else here[:-1]
        base = package[: len(package) - node.level + 1]
        module = ".".join([*base, module] if module else base)
    if module == PACKAGE:
        return [f"{PACKAGE}.{alias.name}" for alias in node.names]
    return [module]


def target_of(name: str) -> str | None:
    """The top-level package of a dotted name inside hotstep_ray; None outside it."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    return VERSION if len(parts) == 1 else parts[1]  # `hotstep_ray.__version__` is VERSION


def package_imports() -> list[Import]:
    """Every import between two different top-level packages of hotstep_ray."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        source = package_of(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
        for node in sorted(nodes, key=lambda n: n.lineno):
            for name in imported_names(node, path):
                target = target_of(name)
                if target is not None and target != source:
                    where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
                    found.append(Import(source, target, where))
    return found


def package_graph(imports: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in imports:
        graph[edge.source].add(edge.target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` as [a, b, ..., a]; [] when there is none (depth-first search)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str]:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return []
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            cycle = visit(nxt)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return []

    for start in sorted(graph):
        cycle = visit(start)
        if cycle:
            return cycle
    return []


def test_every_package_has_a_layer():
    packages = {package_of(path) for path in ROOT.rglob("*.py")}
    missing = sorted(packages - set(LAYERS))
    assert not missing, f"give these a layer in tests/test_layers.py LAYERS: {missing}"
    gone = sorted(set(LAYERS) - packages)
    assert not gone, f"LAYERS names packages that no longer exist: {gone}"


def test_imports_go_to_lower_layers_only():
    offending = [
        f"{edge.where} ({edge.source}, layer {LAYERS[edge.source]}) -> {edge.target} "
        f"(layer {LAYERS[edge.target]})"
        for edge in package_imports()
        if LAYERS[edge.target] >= LAYERS[edge.source]
    ]
    assert not offending, "imports upwards or across one layer:\n" + "\n".join(offending)


def test_the_package_graph_has_no_cycle():
    imports = package_imports()
    cycle = find_cycle(package_graph(imports))
    if cycle:
        arrows = set(zip(cycle, cycle[1:], strict=False))
        lines = [
            f"{e.where}: {e.source} -> {e.target}"
            for e in imports
            if (e.source, e.target) in arrows
        ]
        raise AssertionError(" -> ".join(cycle) + "\n" + "\n".join(lines))


def test_the_checker_sees_imports_at_any_depth():
    """The parser finds function-level and TYPE_CHECKING imports and resolves relative ones."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "import hotstep_ray.core.storage\n"
        "from hotstep_ray import __version__, dataset\n"
        "if TYPE_CHECKING:\n"
        "    from hotstep_ray.calibration import bake\n"
        "def f():\n"
        "    from ..audition import planner\n"
        "    from . import dit\n"
    )
    path = ROOT / "training" / "example.py"  # only its place in the package is used
    tree = ast.parse(source)
    names = [
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in imported_names(node, path)
    ]
    targets = {target_of(name) for name in names} - {None}
    assert targets == {"core", VERSION, "dataset", "calibration", "audition", "training"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
