"""The layers of the Layers of docs/design.md, checked on the source of all four packages: every
arrow points down, and nothing imports in a circle, neither two modules nor two packages.

From the top; an arrow may point down, or sideways inside one package (where the coordinator's
own layers, ``core`` at the bottom, say more):

    coordinator.cli   the ``gemmanet`` command, the top of the program: it wires the commands
                      of sim/ and tools/ too, but imports them only inside the functions that
                      parse or run them, never at module level, and nothing imports it (the
                      tools that start a coordinator run ``python -m coordinator.cli``)
    sim     tools     the simulator and the tools drive the coordinator; neither imports the
                      other
    coordinator       the service; imports neither sim/ nor tools/
    protocol          sans-IO; imports nothing of ours

and no product module (anything outside tests/) imports the test doubles of tools/fakes/.
Every import counts, TYPE_CHECKING and function-level ones too: a circle of types or of lazy
imports is still a circle of ideas. coordinator.cli counts as a package of its own in the
package graph, since it is the one module allowed to point up.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.fresh_imports import modules_after

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("coordinator", "protocol", "sim", "tools")
CLI = "coordinator.cli"
FAKES = "tools.fakes"


@dataclass(frozen=True)
class Import:
    target: str
    #: inside a function body (run when the function is), not when the module loads
    lazy: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_names(node: ast.AST, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            up = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(up + ([base] if base else []))
        return [base] + [f"{base}.{a.name}" for a in node.names]
    return []


def imports_of(path: Path, modules: set[str]) -> set[Import]:
    """Project modules ``path`` imports, anywhere in the file (TYPE_CHECKING blocks included)."""
    found: set[Import] = set()
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    )

    def visit(node: ast.AST, lazy: bool) -> None:
        for name in _imported_names(node, package):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(Import(name, lazy))
        inside = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return found


def import_graph() -> dict[str, set[Import]]:
    paths = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p) for p in paths}
    return {
        module_name(p): {i for i in imports_of(p, modules) if i.target != module_name(p)}
        for p in paths
    }


def graph() -> dict[str, set[str]]:
    return {module: {i.target for i in found} for module, found in import_graph().items()}


def within(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def cycles_of(edges: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target, [*stack, target])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return cycles


def test_no_two_modules_import_each_other_in_a_circle() -> None:
    edges = graph()
    # A module importing its own package's __init__ is not a cycle worth the name (the
    # __init__ re-exports); drop package -> submodule edges before looking for cycles.
    for module, targets in edges.items():
        edges[module] = {t for t in targets if not module.startswith(t + ".")}
    cycles = cycles_of(edges)
    assert not cycles, cycles


def package_of(module: str) -> str:
    return CLI if within(module, CLI) else module.partition(".")[0]


def test_no_two_packages_import_each_other_in_a_circle() -> None:
    # Modules may be free of circles while their packages are not (coordinator.x -> tools.y
    # -> coordinator.z): then neither package can be understood, or shipped, without the other.
    edges: dict[str, set[str]] = {}
    for module, targets in graph().items():
        edges.setdefault(package_of(module), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(module)
        )
    cycles = cycles_of(edges)
    assert not cycles, cycles


def test_every_arrow_points_down() -> None:
    forbidden = {
        # layer: what it must never import
        "protocol": ("coordinator", "sim", "tools"),
        "coordinator.core": (
            "coordinator.runtime",
            "coordinator.coordination",
            "coordinator.api",
            "coordinator.store",
            "coordinator.app",
            "coordinator.server",
        ),
        "coordinator.coordination": ("coordinator.runtime", "coordinator.api", "coordinator.app"),
        "coordinator.runtime": ("coordinator.api", "coordinator.app", "coordinator.server"),
        "sim": ("tools",),
        "tools": ("sim",),
    }
    wrong = [
        (module, target)
        for module, targets in graph().items()
        for layer, banned in forbidden.items()
        if within(module, layer)
        for target in targets
        if any(within(target, b) for b in banned)
    ]
    assert not wrong, wrong


def test_the_coordinator_imports_sim_and_tools_only_lazily_from_its_cli() -> None:
    wrong = [
        (module, found.target, "lazily" if found.lazy else "at module level")
        for module, imports in import_graph().items()
        if within(module, "coordinator")
        for found in imports
        if (within(found.target, "sim") or within(found.target, "tools"))
        and (module != CLI or not found.lazy)
    ]
    assert not wrong, wrong


def test_nothing_imports_the_cli() -> None:
    wrong = [module for module, targets in graph().items() if CLI in targets and module != CLI]
    assert not wrong, wrong


def test_no_product_module_imports_the_test_fakes() -> None:
    wrong = [
        (module, target)
        for module, targets in graph().items()
        if not within(module, FAKES)
        for target in targets
        if within(target, FAKES)
    ]
    assert not wrong, wrong


_PROBE = """
import contextlib, io
from coordinator import cli
with contextlib.redirect_stdout(io.StringIO()):
    try:
        cli.main(["serve", "--help"])
    except SystemExit:
        pass
"""


def test_gemmanet_serve_loads_neither_the_simulator_nor_the_tools() -> None:
    # What parsing `gemmanet serve` imports, in a fresh interpreter: nothing of the simulator
    # or the tools (and no pytest, which trio.testing would bring), none of which it runs.
    loaded = {name.partition(".")[0] for name in modules_after(_PROBE)}
    assert "coordinator" in loaded
    assert not loaded & {"sim", "tools", "pytest"}, sorted(loaded & {"sim", "tools", "pytest"})


def test_the_pure_layers_import_no_event_loop_and_no_redis() -> None:
    impure = ("trio", "coredis", "redis", "asyncio", "quart", "hypercorn", "time")
    wrong = []
    for pkg in ("protocol", "coordinator/core"):
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                else:
                    continue
                wrong += [(str(path), n) for n in names if n.split(".")[0] in impure]
    assert not wrong, wrong
