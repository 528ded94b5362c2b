"""The layers of the README's Design section, checked on the source: every arrow points down,
and no two modules import each other in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("coordinator", "protocol")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Project modules ``path`` imports, anywhere in the file (TYPE_CHECKING blocks included)."""
    found: set[str] = set()
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    )
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + [base]
                )
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    paths = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) - {module_name(p)} for p in paths}


def test_no_two_modules_import_each_other_in_a_circle() -> None:
    edges = graph()
    # A module importing its own package's __init__ is not a cycle worth the name (the
    # __init__ re-exports); drop package -> submodule edges before looking for cycles.
    for module, targets in edges.items():
        edges[module] = {t for t in targets if not module.startswith(t + ".")}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target, [*stack, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_every_arrow_points_down() -> None:
    forbidden = {
        # layer: what it must never import
        "protocol": ("coordinator",),
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
    }
    wrong = [
        (module, target)
        for module, targets in graph().items()
        for layer, banned in forbidden.items()
        if module == layer or module.startswith(layer + ".")
        for target in targets
        if any(target == b or target.startswith(b + ".") for b in banned)
    ]
    assert not wrong, wrong


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
