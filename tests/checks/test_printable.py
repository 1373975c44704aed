"""checks/printable.py: what a terminal would act on is shown as its escape, the rest kept."""

from __future__ import annotations

import pytest

from nodecheck.checks.printable import printable

# (character, how it is shown): the C0 controls (a newline, a tab, CR, BEL, ESC), DEL, the
# C1 controls (U+009B is CSI), the line and paragraph separators, the bidi embeddings,
# overrides and isolates ("Trojan Source"), a zero-width space, and a lone surrogate (a
# byte that is not UTF-8, decoded with surrogateescape).
ESCAPED = [
    ("\n", "\\n"),
    ("\t", "\\t"),
    ("\r", "\\r"),
    ("\x07", "\\x07"),
    ("\x1b", "\\x1b"),
    ("\x7f", "\\x7f"),
    ("\x80", "\\x80"),
    ("\x9b", "\\x9b"),
    ("\x9f", "\\x9f"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
    *((chr(code), f"\\u{code:04x}") for code in range(0x202A, 0x202F)),
    *((chr(code), f"\\u{code:04x}") for code in range(0x2066, 0x206A)),
    ("\u200b", "\\u200b"),
    ("\udc80", "\\udc80"),
]


@pytest.mark.parametrize(("char", "shown"), ESCAPED, ids=[shown for _, shown in ESCAPED])
def test_what_a_terminal_acts_on_is_shown_as_its_escape(char: str, shown: str) -> None:
    assert printable(f"a{char}b") == f"a{shown}b"


def test_text_of_any_script_is_kept() -> None:
    text = "GPU 0 — 80 °C, Größe 日本語, a\\b (…) ∑"
    assert printable(text) == text
