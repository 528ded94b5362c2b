"""MkDocs hook (mkdocs.yml ``hooks``): puts the API's OpenAPI document into the docs site.

The document is built from the app itself (``create_app`` with the embedded defaults; nothing
is started, nothing is fetched), so the site's copy cannot drift from what ``GET /openapi.json``
serves. It becomes ``reference/openapi.json`` in the built site, and the page
``reference/openapi.md`` gets a table of every route, method and status from it appended.
Offline: no CDN, no viewer script, only the JSON and a table. Every page also gets the pipes of
its tables' code spans as Python-Markdown reads them (``unescape_table_code``).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["openapi_document", "routes_table", "unescape_table_code"]

_PAGE = "reference/openapi.md"
_JSON = "reference/openapi.json"
_METHODS = ("get", "post", "put", "patch", "delete")


def openapi_document() -> dict[str, Any]:
    """The document ``GET /openapi.json`` serves, built in process."""
    import trio

    from coordinator.app import create_app
    from coordinator.settings import Settings

    app = create_app(Settings())

    async def build() -> dict[str, Any]:
        async with app.app_context():
            schema: dict[str, Any] = app.extensions["QUART_SCHEMA"].openapi_provider.schema()
            return schema

    # Through JSON, as the route serves it (status keys become strings).
    document: dict[str, Any] = json.loads(json.dumps(trio.run(build)))
    return document


def routes_table(document: dict[str, Any]) -> str:
    """One row per route and method: its summary and the statuses it documents."""
    rows = ["| method | path | statuses | summary |", "| --- | --- | --- | --- |"]
    for path, item in sorted(document["paths"].items()):
        for method in _METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            statuses = ", ".join(sorted(operation.get("responses", {})))
            summary = (operation.get("summary") or operation.get("description") or "").strip()
            summary = summary.splitlines()[0] if summary else ""
            rows.append(f"| `{method.upper()}` | `{path}` | {statuses} | {summary} |")
    return "\n".join(rows)


_document: dict[str, Any] | None = None


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    global _document
    _document = openapi_document()
    files.append(
        File.generated(config, _JSON, content=json.dumps(_document, indent=2, sort_keys=True))
    )
    return files


_CODE_SPAN = re.compile(r"`[^`\n]*`")


def unescape_table_code(markdown: str) -> str:
    """``\\|`` inside a code span of a table row as ``|``.

    GitHub needs the pipe of a code span in a table escaped, and shows it unescaped; Python-
    Markdown already keeps a code span's pipes out of the cell split, and would show the
    backslash. The pages are written for GitHub; the site gets them as Python-Markdown wants.
    """
    lines = markdown.split("\n")
    for index, line in enumerate(lines):
        if line.lstrip().startswith("|") and "\\|" in line:
            lines[index] = _CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = unescape_table_code(markdown)
    if page.file.src_uri != _PAGE or _document is None:
        return markdown
    return markdown.rstrip() + "\n\n" + routes_table(_document) + "\n"
