"""The node's filesystem roots, the one way nodecheck reads a file, and how it writes one.

Every read goes through `NodeFS`, so tests and containers can point nodecheck
at another tree (`--sysfs-root`, `--procfs-root`, `--rootfs`), as
node_exporter does with `--path.sysfs`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class ReadError(Exception):
    """A file could not be read or made no sense; the message names the path."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


def _reason(err: OSError) -> str:
    if err.errno == errno.ENOENT:
        return "missing"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return err.strerror or type(err).__name__


def read_bytes(path: Path, limit: int = 1 << 20) -> bytes:
    """Read up to `limit` bytes; ReadError names the path on any failure."""
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(limit)
    except OSError as err:
        raise ReadError(path, _reason(err)) from err


def read_text(path: Path) -> str:
    """Read a small text attribute, stripped of surrounding whitespace."""
    data = read_bytes(path)
    try:
        return data.decode().strip()
    except UnicodeDecodeError as err:
        raise ReadError(path, "not text") from err


def read_optional_text(path: Path) -> str | None:
    """Like read_text, but None when the file does not exist.

    Sysfs creates some attributes only where they apply (the PCIe link files
    exist for PCI Express devices only), so absence carries meaning there.
    """
    try:
        return read_text(path)
    except ReadError as err:
        if err.reason == "missing":
            return None
        raise


def parse_attr(path: Path, text: str, parse: Callable[[str], T], expected: str) -> T:
    """Parse a file's text; a ReadError names the path and what it held when that fails."""
    try:
        return parse(text)
    except ValueError as err:
        shown = repr(text) if text else "an empty file"
        raise ReadError(path, f"expected {expected}, got {shown}") from err


def read_parsed(path: Path, parse: Callable[[str], T], expected: str) -> T:
    """read_text, then parse: "<path>: expected an integer, got 'x'" on bad content."""
    return parse_attr(path, read_text(path), parse, expected)


def list_dir(path: Path) -> list[str]:
    """Sorted entries of a directory; [] when it does not exist."""
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    except OSError as err:
        raise ReadError(path, _reason(err)) from err


def write_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace `path` with `text` so that a reader (or a crash) sees old or new, whole."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
            file.flush()
            os.fchmod(file.fileno(), mode)
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@dataclass(frozen=True)
class NodeFS:
    """Where the node's sysfs, procfs and root filesystem are mounted."""

    sysfs: Path = Path("/sys")
    procfs: Path = Path("/proc")
    rootfs: Path = Path("/")

    def sys(self, *parts: str) -> Path:
        return self.sysfs.joinpath(*parts)

    def proc(self, *parts: str) -> Path:
        return self.procfs.joinpath(*parts)

    def host(self, absolute: str) -> Path:
        """A host path such as /etc/nccl.conf, under the root filesystem."""
        return self.rootfs / absolute.lstrip("/")
