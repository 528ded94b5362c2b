"""The docs say what the code does, once: the settings reference is the one generated from
coordinator/settings.py, every error code has its entry in the troubleshooting page, and the
user-facing docs carry no work diary (commit hashes, internal issue numbers, dates) outside the
benchmark history."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coordinator import errors
from coordinator.settings import VARIABLES, shown_default
from protocol import CloseCode, TaskErrorCode
from tools import docs_settings

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: The only places where dates and commits belong: the benchmark history and the load-test
#: reports it links.
DATED = {DOCS / "benchmarks.md"} | set((DOCS / "loadtest").rglob("*.md"))
USER_DOCS = sorted({ROOT / "README.md", *DOCS.rglob("*.md")} - DATED)


def _reference() -> str:
    return (DOCS / "interface.md").read_text(encoding="utf-8")


def test_the_settings_tables_are_the_generated_ones() -> None:
    text = _reference()
    assert docs_settings.BEGIN in text and docs_settings.END in text
    assert docs_settings.rewrite(text) == text, "run python -m tools.docs_settings"


def _generated_rows() -> dict[str, str]:
    """variable -> its default cell, from the generated block only."""
    block = _reference().split(docs_settings.BEGIN)[1].split(docs_settings.END)[0]
    rows = {}
    for line in block.splitlines():
        found = re.match(r"\| `(GEMMANET_[A-Z_]+)` \| ([^|]+) \|", line)
        if found:
            assert found.group(1) not in rows, f"{found.group(1)} is listed twice"
            rows[found.group(1)] = found.group(2).strip().strip("`")
    return rows


def test_every_setting_is_in_the_reference_with_its_default() -> None:
    rows = _generated_rows()
    for field_name, (variable, _) in VARIABLES.items():
        assert variable in rows, f"{variable} is missing from docs/interface.md"
        assert rows[variable] == shown_default(field_name), (variable, rows[variable])


def test_a_setting_without_a_meaning_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(VARIABLES, "brand_new", ("GEMMANET_BRAND_NEW", lambda n, v: v))
    with pytest.raises(SystemExit, match="no meaning .*brand_new"):
        docs_settings.render()


def test_a_changed_default_makes_the_reference_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the check catches: a default changed in settings.py but not regenerated.
    monkeypatch.setattr(docs_settings, "shown_default", lambda name: "changed")
    assert docs_settings.rewrite(_reference()) != _reference()
    assert docs_settings.main(["--check"]) == 1


def _error_codes() -> set[str]:
    codes = set()
    for name in errors.__all__:
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, errors.GemmaNetError):
            codes.add(cls.code)
    return codes


def test_troubleshooting_explains_every_code() -> None:
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    shown = set(re.findall(r"`([a-z_]+)`", page))
    missing = sorted(_error_codes() - shown)
    assert not missing, f"docs/troubleshooting.md lacks the error codes {missing}"
    missing_tasks = sorted({c.value for c in TaskErrorCode} - shown)
    assert not missing_tasks, f"docs/troubleshooting.md lacks the task error codes {missing_tasks}"
    closes = {str(int(c)) for c in CloseCode}
    rows = {
        n for row in re.findall(r"^\| ([\d, ]+) \|", page, re.MULTILINE) for n in row.split(", ")
    }
    assert closes <= rows, f"docs/troubleshooting.md lacks the close codes {sorted(closes - rows)}"


#: A commit hash: 7-40 hex digits with at least one digit and one letter.
_HASH = re.compile(r"(?<![\w/#-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
_ISSUE = re.compile(r"\bissues? #?\d+\b|(?<![\w&/])#\d+\b|\bseed 0\d\d\b|§\s?\d", re.IGNORECASE)
#: A calendar date (a timestamp in an example, the date with its time of day after a T or a
#: space, is not a diary entry).
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d(?![T ]\d\d:)\b")
_URL = re.compile(r"https?://\S+")


def diary_entries(text: str) -> list[str]:
    """What in ``text`` reads like a work diary: commit hashes, issue references, dates."""
    text = _URL.sub("", text)
    found = [m for pattern in (_HASH, _ISSUE, _DATE) for m in pattern.finditer(text)]
    return [match.group(0) for match in sorted(found, key=lambda m: m.start())]


def test_the_scan_finds_what_it_looks_for() -> None:
    assert diary_entries("measured at commit 7a71845 (issue 11, see #12) on 2026-12-01") == [
        "7a71845",
        "issue 11",
        "#12",
        "2026-12-01",
    ]
    assert (
        diary_entries(
            "see https://github.com/x/y/issues/330, ts 2026-12-01T02:51:28Z, 1,044,480 bytes, "
            "created 2026-12-03 06:35:47Z, "
            "interface.md#settings, gn_… keys, a 2e6 figure, the seed 7 run"
        )
        == []
    )


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_carry_no_work_diary(path: Path) -> None:
    found = diary_entries(path.read_text(encoding="utf-8"))
    assert not found, (
        f"{path.relative_to(ROOT)}: {found} (commits and dates belong in docs/benchmarks.md; "
        "internal issue numbers nowhere)"
    )


def test_the_readme_links_resolve() -> None:
    # The README lies outside the docs site, so mkdocs does not check its links.
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_readme_stays_short() -> None:
    # The README says what GemmaNet is, the quick start, the tests and a map; the rest lives in
    # a guide under docs/ (mkdocs.yml's nav).
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail into docs/"
