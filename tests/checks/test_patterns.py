"""LazyPattern: re.compile's pattern, compiled when first used."""

from __future__ import annotations

import re

import pytest

from nodecheck.checks.node.patterns import LazyPattern


def test_a_lazy_pattern_matches_as_the_compiled_one() -> None:
    lazy = LazyPattern(r"(\d+)-(\d+)", re.ASCII)
    assert "match" not in vars(lazy)  # nothing compiled yet
    compiled = re.compile(r"(\d+)-(\d+)", re.ASCII)
    for text in ("12-34", "x12-34", "12-34x", "", "١٢-٣٤"):
        for method in ("match", "fullmatch", "search"):
            mine, theirs = getattr(lazy, method)(text), getattr(compiled, method)(text)
            assert (mine and mine.groups()) == (theirs and theirs.groups()), (method, text)
    assert lazy.fullmatch("a12-34", 1) is not None
    # Compiled once: its methods are the instance's own from then on.
    assert vars(lazy)["match"].__self__ is vars(lazy)["search"].__self__
    with pytest.raises(AttributeError):
        lazy.sub  # noqa: B018
