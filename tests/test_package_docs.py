"""Each package ``__init__`` says what lives there (house style 6): its listing names exactly
the modules and subpackages that are really there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: every package of ours with modules of its own (tests/ and the tool library's fakes aside)
LISTED = sorted(
    str(init.parent.relative_to(ROOT))
    for top in ("coordinator", "protocol", "sim", "tools")
    for init in (ROOT / top).rglob("__init__.py")
    if init.parent != ROOT / top or top in ("coordinator", "sim")
)


def _docstring(package: Path) -> str:
    text = (package / "__init__.py").read_text()
    return text.split('"""')[1]


@pytest.mark.parametrize("package", LISTED)
def test_package_docstring_lists_exactly_its_modules(package: str) -> None:
    path = ROOT / package
    doc = _docstring(path)
    named = set(re.findall(r"(?<![\w/])([a-z_]+\.py|[a-z_]+/)(?=\s)", doc))
    named = {n for n in named if "/" not in n.rstrip("/")}
    present = {p.name for p in path.glob("*.py") if p.name != "__init__.py"}
    present |= {p.name + "/" for p in path.iterdir() if (p / "__init__.py").exists()}
    # A folder of package data (no __init__) may be listed too.
    named -= {n for n in named if n.endswith("/") and (path / n).is_dir() and n not in present}
    # A listing may mention a sibling package as context ("the simulator (sim/) ...").
    context = {"sim/", "coordinator/"}
    assert named - context == present, (sorted(named - context - present), sorted(present - named))
