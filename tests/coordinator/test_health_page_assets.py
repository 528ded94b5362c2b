"""The System Health page's files: each one the page refers to is served and shipped in the
package (pyproject's package-data; a non-editable install must carry them), and none refers to
another origin (no CDN: the page works on a network without internet)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from coordinator.api.health.routes import ASSETS, PAGE_PATH, render_page

ROOT = Path(__file__).resolve().parents[2]
PAGE_DIR = ROOT / "coordinator" / "api" / "health" / "page"
SVG_NAMESPACE = "http://www.w3.org/2000/svg"


def test_every_file_of_the_page_is_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["coordinator.api.health"]
    files = sorted(p.name for p in PAGE_DIR.iterdir())
    assert files == sorted([*ASSETS, "index.html"])
    for name in files:
        assert any(fnmatch.fnmatch(f"page/{name}", g) for g in globs), name


def test_the_page_refers_only_to_its_own_files() -> None:
    page = render_page("i-<script>")
    assert "i-&lt;script&gt;" in page and "i-<script>" not in page
    referenced = set(re.findall(rf'(?:src|href)="{PAGE_PATH}/([^"]+)"', page))
    assert referenced == set(ASSETS), referenced
    for path in PAGE_DIR.iterdir():
        # The SVG namespace is a name, not a place anything is loaded from.
        text = path.read_text().replace(SVG_NAMESPACE, "")
        found = re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE)
        assert found is None, f"{path.name} refers to another origin: {found.group()}"
