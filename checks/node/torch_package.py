"""The version of the torch installed for this Python, from its package metadata: the
`Version:` field of the first `torch` distribution on sys.path, as importlib.metadata's
`version("torch")` finds it; torch is never imported.

Read here rather than through importlib.metadata, whose import (email, zipfile, csv)
costs a `nodecheck check` more than all its NVML calls. An installed distribution is a
`{name}-{version}.dist-info` folder holding METADATA (the Recording Installed Projects
specification, packaging.python.org/specifications/recording-installed-packages), or,
from `setup.py develop` and old installs, a `{name}.egg-info` or `{name}-{version}...
.egg-info` folder holding PKG-INFO; both files are the Core Metadata format, whose
`Version` field is the version (packaging.python.org/specifications/core-metadata)."""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Callable, Iterable

from nodecheck.checks.record import record

# A METADATA file's header, where Version is, is a few hundred bytes; its description
# that follows can be long.
METADATA_READ_LIMIT = 64 * 1024


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


def distribution_name(folder: str) -> str | None:
    """The normalised project name of a metadata folder ("torch-2.9.1+cu128.dist-info"
    -> "torch", "Torch.egg-info" -> "torch"); None for any other entry. Names compare
    as PEP 503 normalises them: case, and runs of "-", "_", "." alike."""
    for suffix in (".dist-info", ".egg-info"):
        if folder.endswith(suffix):
            stem = folder[: -len(suffix)]
            # The name ends at the first "-": a name's own "-"s are "_" in the folder.
            name = stem.split("-", 1)[0]
            return re.sub(r"[-_.]+", "-", name).lower()
    return None


def metadata_version(text: str) -> str | None:
    """The Version field of a Core Metadata header ("Version: 2.9.1" -> "2.9.1"); the
    header ends at the first empty line, where the description begins."""
    for line in text.splitlines():
        if not line.strip():
            break
        key, colon, value = line.partition(":")
        if colon and key.strip().lower() == "version":
            return value.strip() or None
    return None


def find_distribution(
    wanted: Callable[[str], bool], search_path: Iterable[str]
) -> tuple[str, str] | None:
    """(normalised name, version) of the first distribution whose name `wanted` takes, in
    the first folder of `search_path` that holds one, as importlib.metadata finds it; None
    where none does. Each METADATA read is bounded (METADATA_READ_LIMIT)."""
    for entry in search_path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:  # not a folder (a zip), or gone
            continue
        for folder in names:
            name = distribution_name(folder)
            if name is None or not wanted(name):
                continue
            for file in ("METADATA", "PKG-INFO"):
                path = os.path.join(entry or ".", folder, file)
                try:
                    # A regular file only: a FIFO in its place would block the open.
                    if not stat.S_ISREG(os.stat(path).st_mode):
                        continue
                    with open(path, "rb") as handle:
                        header = handle.read(METADATA_READ_LIMIT)
                except OSError:
                    continue
                version = metadata_version(header.decode("utf-8", "replace"))
                if version is not None:
                    return name, version
    return None


def find_distribution_version(project: str, search_path: Iterable[str]) -> str | None:
    """`project`'s version from the first folder of `search_path` that holds its
    metadata, as importlib.metadata.version does; None where none does."""
    found = find_distribution(lambda name: name == project, search_path)
    return None if found is None else found[1]


def read_torch_version(search_path: Iterable[str] | None = None) -> TorchVersion:
    text = find_distribution_version("torch", sys.path if search_path is None else search_path)
    if text is None:
        return TorchVersion(None)
    return TorchVersion(parse_torch_version(text), text)
