"""Citations a reader can follow, and text that says what the code does.

- Every citation of a section of a doc page (the page's path, a section sign and the
  section's number) names a page of docs/ that exists and a numbered heading of it.
- Outside docs/, the hardware reference is cited by its path from the repository root,
  and nothing points at files beside the checkout that a user does not have.
- Code, docs, tests, benchmarks and monitoring rules describe the code, not the work that
  produced it: no bare issue numbers of this project's tracker, no "before the change".
  An upstream project's issue (owner/repo#N, or one named by its project) stays.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve()
DOCS = REPO / "docs"

# Built or installed, never written by hand: nothing there is a citation of ours.
SKIPPED_DIRS = {
    ".git",
    ".venv",
    ".typecheck",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "__pycache__",
    "build",
    "gpu-report",
}
# Where the text describing the code lives (README.md beside them).
PROSE_AREAS = ("agent", "checks", "tuning", "bench", "docs", "tests", "monitoring")

# "docs/<page>.md §N" (or §N.M); inside docs/ a page may cite a sibling as "<page>.md §N".
CITATION = re.compile(r"(?<![\w/.-])((?:docs/)?[\w-]+\.md)\s?§\s?(\d+(?:\.\d+)*)")
# A numbered heading: "## 3. Title", "### 3.2 Title".
NUMBERED_HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)*)\.?\s", re.M)
BARE_HARDWARE = re.compile(r"(?<!docs/)\bhardware\.md")
OUTSIDE_CHECKOUT = re.compile(r"\.\./shared|shared/reference")
ISSUE_NUMBER = re.compile(r"\bissues?\s+#?\d+", re.I)
# What may stand before "issue N" when it is an upstream project's: owner/repo, or the
# project's name.
UPSTREAM_PREFIX = re.compile(r"(?:[\w.-]+/[\w.-]+|pytorch|nccl|dcgm)\s+$", re.I)
PROCESS_PHRASES = re.compile(
    r"before the change|this session|the issue's|the issue says|was asked", re.I
)


def _text_files(top: Path) -> Iterator[Path]:
    candidates = [top] if top.is_file() else sorted(top.rglob("*"))
    for path in candidates:
        relative = path.relative_to(REPO).parts
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in relative):
            continue
        if path.is_file() and not path.is_symlink():
            yield path


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # not text


def _lines(paths: Iterator[Path]) -> Iterator[tuple[str, int, str]]:
    for path in paths:
        if path.resolve() == SELF:
            continue
        text = _read(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            yield str(path.relative_to(REPO)), number, line


def numbered_sections(page: Path) -> set[str]:
    """The section numbers of a doc page's numbered headings."""
    return set(NUMBERED_HEADING.findall(page.read_text(encoding="utf-8")))


def citations() -> list[tuple[str, int, str, str]]:
    """(file, line, page, section) of every section citation in the repository."""
    return [
        (where, number, page, section)
        for where, number, line in _lines(_text_files(REPO))
        for page, section in CITATION.findall(line)
    ]


def unresolved(cited: list[tuple[str, int, str, str]]) -> list[str]:
    problems = []
    for where, number, page, section in cited:
        if not page.startswith("docs/") and not where.startswith("docs/"):
            problems.append(f"{where}:{number}: {page} §{section}: cite it as docs/{page}")
            continue
        file = DOCS / Path(page).name
        if not file.is_file():
            problems.append(f"{where}:{number}: {page}: no such page")
        elif section not in numbered_sections(file):
            problems.append(f"{where}:{number}: {page} has no section {section}")
    return problems


def test_citation_pattern() -> None:
    line = "per docs/hardware.md §4 and docs/tuning.md § 2.1, not RFC 9112 §2.1"
    assert CITATION.findall(line) == [("docs/hardware.md", "4"), ("docs/tuning.md", "2.1")]
    assert NUMBERED_HEADING.findall("## 1. A\n### 1.2 B\n## C\n# 3. D\n") == ["1", "1.2"]


def test_every_section_citation_resolves() -> None:
    cited = citations()
    assert cited, "no section citations found: the pattern no longer matches them"
    problems = unresolved(cited)
    assert not problems, "\n".join(problems)


def test_hardware_reference_cited_by_its_path() -> None:
    problems = [
        f"{where}:{number}: {line.strip()}"
        for area in sorted(p for p in REPO.iterdir() if p.name != "docs")
        for where, number, line in _lines(_text_files(area))
        if BARE_HARDWARE.search(line)
    ]
    assert not problems, "cite docs/hardware.md, with its path:\n" + "\n".join(problems)


def test_nothing_points_outside_the_checkout() -> None:
    problems = [
        f"{where}:{number}: {line.strip()}"
        for where, number, line in _lines(_text_files(REPO))
        if OUTSIDE_CHECKOUT.search(line)
    ]
    assert not problems, "a user has no such files:\n" + "\n".join(problems)


def process_words(line: str) -> list[str]:
    """The words of `line` about how the work was done rather than what the code does."""
    found = [m.group(0) for m in PROCESS_PHRASES.finditer(line)]
    for match in ISSUE_NUMBER.finditer(line):
        if not UPSTREAM_PREFIX.search(line[: match.start()]):
            found.append(match.group(0))
    return found


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("Goals (issues 2, 6 and 14)", ["issues 2"]),
        ("one screen (issue 23, item 20)", ["issue 23"]),
        ("Each test failed before the change", ["before the change"]),
        ("the bus id it had in this session", ["this session"]),
        ("pytorch issue #183387", []),
        ("NVIDIA/nccl issue 790, NVIDIA/nccl#790, DeepSpeed #2928", []),
        ("report the issue (fatal)", []),
    ],
)
def test_process_words_pattern(line: str, words: list[str]) -> None:
    assert process_words(line) == words


def test_no_process_words() -> None:
    areas = [REPO / name for name in PROSE_AREAS] + [REPO / "README.md"]
    problems = [
        f"{where}:{number}: {', '.join(words)}: {line.strip()}"
        for area in areas
        if area.exists()
        for where, number, line in _lines(_text_files(area))
        if (words := process_words(line))
    ]
    assert not problems, "say what the code does, not how it was made:\n" + "\n".join(problems)
