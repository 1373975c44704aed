"""Text from outside nodecheck, made safe to show to a person.

What the node says (a file in sysfs, a kernel log line, a job's environment, a process
name), what a capture holds, what a configuration file or the command line gives, may
hold any character. On a terminal some of them act instead of showing: a newline or a CR
starts a line nodecheck did not write (a forged report line), ESC and the C1 controls
start escape sequences (ECMA-48: OSC 0 sets the window title, OSC 52 writes the
clipboard, CSI 2K erases a line; U+009B is CSI itself on terminals that read 8-bit
controls), and the bidirectional overrides and isolates reorder what follows them
("Trojan Source", CVE-2021-42574; Unicode UAX #9). printable() is the one place that
escapes them: every renderer of text for people (the check table, inventory, tune, the
agent's log lines, error messages, Slurm reasons, NPD's message) passes each string that
came from outside, or each finished line, through it. JSON output needs none of it:
json.dumps escapes the control characters, and with ensure_ascii (its default) every
character beyond ASCII.
"""

from __future__ import annotations

from collections.abc import Callable

ELLIPSIS = "..."


def python_escape(char: str) -> str:
    """The character as a Python string literal writes it: "\\x1b", "\\n", "\\u202e",
    "\\udc80" (a lone surrogate, which is how a byte that is not UTF-8 decodes)."""
    return char.encode("unicode_escape").decode("ascii")


def printable(text: str, escape: Callable[[str], str] = python_escape) -> str:
    """`text` with every character str.isprintable() refuses written as its escape, so it
    shows as text and does nothing: the C0 controls (newline, tab, CR, BEL, ESC), DEL, the
    C1 controls U+0080-U+009F, every separator but the space (U+2028, U+2029, U+00A0),
    the format characters (the bidi overrides U+202A-U+202E and isolates U+2066-U+2069,
    zero-width ones), unassigned and private-use code points, and lone surrogates (which
    stdout could not even encode). Other characters (letters of any script, "…", "°")
    are kept. A backslash is kept as it is: the result is for reading, not for parsing
    back. `escape` writes one character in another notation (TOML's, for a file that is
    read back)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else escape(char) for char in text)


def one_line(text: str, max_bytes: int) -> str:
    """`text` on one line for a consumer that keeps one line of bounded length (a Slurm
    reason, NPD's message): each run of whitespace (newlines, tabs, U+2028 included) one
    space, the rest through printable(), at most max_bytes of UTF-8, cut on whole
    characters (with "..." when cut)."""
    shown = printable(" ".join(text.split()))
    encoded = shown.encode("utf-8")
    if len(encoded) <= max_bytes:
        return shown
    return encoded[: max(max_bytes - len(ELLIPSIS), 0)].decode("utf-8", "ignore") + ELLIPSIS


def text_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell, indented two spaces; each cell escaped
    (printable()) before it is measured, so that a column stays aligned."""
    headers = [printable(header) for header in headers]
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [
        max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)
    ]
    lines = ["  " + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False)).rstrip()]
    lines += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
        for row in rows
    ]
    return lines
