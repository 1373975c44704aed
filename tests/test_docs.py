"""The README and docs/: every relative link leads somewhere, the README stays one screen
and points into every doc, and its output excerpts are what nodecheck prints."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.fixtures.demo import replica_options, run_nodecheck

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
README_MAX_LINES = 120  # a newcomer's one screen

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(markdown: str) -> list[str]:
    """The targets of the links in `markdown`, outside code, that are not URLs."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return [t for t in LINK.findall(prose) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of `markdown`: lower case, punctuation dropped,
    spaces as hyphens, a repeated one numbered (-1, -2, ...)."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page.read_text()):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in anchors(file.read_text()):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_anchors_follow_github() -> None:
    text = "# A `b/` c: d\n## Example: the 8-GPU node\n## Same\n## Same\n```\n# not one\n```\n"
    assert anchors(text) == {"a-b-c-d", "example-the-8-gpu-node", "same", "same-1"}


def test_readme_is_one_screen_and_points_into_every_doc() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in relative_links(text)}
    assert [d.name for d in DOCS if d.resolve() not in linked] == []


def excerpts(markdown: str) -> list[tuple[list[str], list[str]]]:
    """Each code block that starts `$ nodecheck ...`: its arguments and its output lines."""
    found = []
    for block in re.findall(r"^```\n(\$ nodecheck .*?)^```", markdown, re.M | re.S):
        command, *shown = block.rstrip("\n").split("\n")
        found.append((shlex.split(command)[2:], shown))
    return found


def shows(excerpt: list[str], output: list[str]) -> bool:
    """Whether `excerpt` is consecutive lines of `output`, where a line of just "..." skips
    any number of lines and a line ending "..." was cut there."""

    def matches(shown: str, line: str) -> bool:
        if shown.endswith("..."):
            return line.startswith(shown[:-3])
        return line.rstrip() == shown.rstrip()

    def from_here(e: int, o: int) -> bool:
        if e == len(excerpt):
            return True
        if excerpt[e] == "...":
            return any(from_here(e + 1, k) for k in range(o, len(output) + 1))
        return o < len(output) and matches(excerpt[e], output[o]) and from_here(e + 1, o + 1)

    return any(from_here(0, start) for start in range(len(output)))


def test_excerpt_matching() -> None:
    output = ["head", "", "a long line", "b", "c", "tail"]
    assert shows(["head", "", "a long...", "...", "tail"], output)
    assert not shows(["head", "b"], output)  # not consecutive
    assert not shows(["a long line, longer..."], output)


def test_readme_excerpts_are_what_nodecheck_prints_on_the_replica(tmp_path: Path) -> None:
    """The README's first commands, run on the faulty replica as `make demo` does (tune in
    its terminal format: the test's stdout is a pipe)."""
    blocks = excerpts(README.read_text())
    assert [args[0] for args, _ in blocks] == ["check", "tune", "inventory"]
    options, environ = replica_options(tmp_path)
    for args, shown in blocks:
        terminal = ["--format", "text"] if args[0] == "tune" else []
        done = run_nodecheck([*options, *args, *terminal], environ, capture=True, timeout=120)
        assert done.returncode in (0, 1), done.stderr
        assert shows(shown, done.stdout.splitlines()), (args, done.stdout)
