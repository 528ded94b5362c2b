"""The docs site builds with ``mkdocs build --strict``: a broken link or anchor, or a page under
docs/ left out of mkdocs.yml's navigation, fails here. The built site carries the API's OpenAPI
document (tools/docs_site.py) and loads nothing from another origin."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FOREIGN = re.compile(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"')


def _build(site: Path, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)]
        + (["-f", str(config)] if config else []),
        check=False,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_site_builds_strictly_with_the_openapi_document(tmp_path: Path) -> None:
    done = _build(tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads((tmp_path / "site" / "reference" / "openapi.json").read_text())
    assert "/api/v1/request" in document["paths"] and document["openapi"].startswith("3.")
    page = (tmp_path / "site" / "reference" / "openapi" / "index.html").read_text()
    assert "/v1/chat/completions" in page  # the generated routes table
    # Code spans in tables show their pipes, not the backslash GitHub needs before them.
    assert "\\|" not in (tmp_path / "site" / "interface" / "index.html").read_text()
    foreign = set()
    for html in (tmp_path / "site").rglob("*.html"):
        foreign |= set(_FOREIGN.findall(html.read_text()))
    assert not foreign, f"the site loads from other origins: {sorted(foreign)}"


def test_a_page_missing_from_the_navigation_fails_the_build(tmp_path: Path) -> None:
    # The check above can fail: the same configuration without one page in `nav`.
    config = (ROOT / "mkdocs.yml").read_text()
    assert "      - Troubleshooting: troubleshooting.md\n" in config
    broken = tmp_path / "mkdocs.yml"
    broken.write_text(
        config.replace("      - Troubleshooting: troubleshooting.md\n", "")
        .replace("docs_dir: docs", f"docs_dir: {ROOT / 'docs'}")
        .replace("  - tools/docs_site.py", f"  - {ROOT / 'tools' / 'docs_site.py'}")
    )
    done = _build(tmp_path / "site", broken)
    assert done.returncode != 0
    assert "troubleshooting.md" in done.stdout + done.stderr
