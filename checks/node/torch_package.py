"""The version of the torch installed for this Python, from its package metadata
(importlib.metadata: the wheel's METADATA file); torch is never imported."""

from __future__ import annotations

import re

from nodecheck.checks.record import record


@record
class TorchVersion:
    """(major, minor) of the installed torch; None when there is none (or its version
    is not a number), `text` as the metadata says it ("2.9.1+cu128"), "" when absent."""

    version: tuple[int, int] | None
    text: str = ""


def parse_torch_version(text: str) -> tuple[int, int] | None:
    """ "2.9.1+cu128" -> (2, 9)."""
    match = re.match(r"^(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def read_torch_version() -> TorchVersion:
    from importlib import metadata

    try:
        text = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return TorchVersion(None)
    return TorchVersion(parse_torch_version(text), text)
