"""The node's filesystem roots, the one way nodecheck reads a file, and how it writes one.

Every read goes through `NodeFS`, so tests and containers can point nodecheck
at another tree (`--sysfs-root`, `--procfs-root`, `--rootfs`), as
node_exporter does with `--path.sysfs`.

Every read is bounded. A file is opened with O_NONBLOCK, so a FIFO (or a
device node) in place of an attribute cannot block the open, and anything
that fstat(2) does not call a regular file is refused by kind before a byte
is read: a read(2) of a FIFO with no writer would wait forever. Sysfs and
procfs attributes are regular files (st_size 4096 or 0), so this refuses
nothing the kernel serves. At most `limit` bytes are read. A read that can
still block in the kernel (an attribute of a wedged device: the driver's
show() waits on the hardware) is recorded in a registry of reads in progress,
so the runner can name the path a check is stuck on.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import posixpath
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path
from threading import get_ident
from time import monotonic
from typing import TypeVar

from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.record import record

T = TypeVar("T")

# Sysfs shows at most a page per text attribute (Documentation/filesystems/sysfs.rst,
# "show() ... must not exceed PAGE_SIZE"), and a PCIe config space is 4096 bytes:
# a megabyte is generous for every file nodecheck reads as text.
DEFAULT_LIMIT = 1 << 20
# Entries of one directory: /proc with a process per pid at the largest pid_max
# (PID_MAX_LIMIT, 4194304 on 64-bit: include/linux/threads.h) stays below this.
DIRECTORY_LIMIT = 1 << 23
# Symlinks followed while resolving one host path, as the kernel's MAXSYMLINKS
# (include/linux/namei.h) bounds path walks.
MAX_SYMLINKS = 40
_CHUNK = 1 << 16


class ReadError(Exception):
    """A file could not be read or made no sense; the message names the path."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


class ImplausibleValueError(ValueError):
    """A value that parses but that the kernel cannot mean; the message says why."""


MISSING = "missing"
PERMISSION_DENIED = "permission denied"
EXITED = "the process has exited"


def os_error_reason(err: OSError) -> str:
    """A plain reason for an OSError: "missing", "permission denied", "a symlink loop ..."."""
    if err.errno == errno.ENOENT:
        return MISSING
    if err.errno in (errno.EACCES, errno.EPERM):
        return PERMISSION_DENIED
    if err.errno == errno.ESRCH:  # /proc/<pid>/... of a process that exited meanwhile
        return EXITED
    if err.errno == errno.ELOOP:
        return "a symlink loop (too many levels of symbolic links)"
    if err.errno == errno.ENOTDIR:
        return "a component of the path is not a directory"
    if err.errno == errno.EIO:
        # Sysfs answers EIO for attributes of a device that stopped responding
        # (pci_read_config_* failing in the attribute's show()).
        return "input/output error (the device did not answer)"
    if err.errno == errno.ENXIO:
        # open(2) of a socket, or of a device node with no device behind it.
        return "no such device or address (a socket or a device node without its device)"
    return err.strerror or type(err).__name__


def describe_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory, not a file"
    if stat.S_ISFIFO(mode):
        return "a FIFO, not a file"
    if stat.S_ISCHR(mode):
        return "a character device, not a file"
    if stat.S_ISBLK(mode):
        return "a block device, not a file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    return "not a regular file"


# Reads in progress: thread id -> (path, monotonic start). One entry per thread:
# a thread reads one file at a time, and writes only its own entry. No lock: setting and
# popping a key and copying the dict are each atomic in CPython (a dict of ints and
# tuples calls no Python code), and a lock per read cost a tenth of a read.
_in_flight: dict[int, tuple[str, float]] = {}


class reading:  # noqa: N801 - used as `with reading(path):`, like a function
    """Record that this thread is reading `path` until the block ends. A class, not a
    generator: it wraps thousands of reads a pass (_read, the hottest, does the same
    inline)."""

    __slots__ = ("_ident", "_path")

    def __init__(self, path: Path | str) -> None:
        self._path = path

    def __enter__(self) -> None:
        self._ident = ident = get_ident()
        _in_flight[ident] = (str(self._path), monotonic())

    def __exit__(self, *exc_info: object) -> None:
        _in_flight.pop(self._ident, None)


@record
class InFlightRead:
    thread: int
    path: str
    started: float


def reads_in_flight() -> list[InFlightRead]:
    """Every read in progress, oldest first."""
    entries = [
        InFlightRead(ident, path, start) for ident, (path, start) in _in_flight.copy().items()
    ]
    return sorted(entries, key=lambda entry: entry.started)


# A path under one of the node's roots: a Path, or (in the hot loops that read thousands
# of files, where pathlib's joins cost more than the reads) the same path as a string.
NodePath = Path | str


@record
class Contents:
    """What a bounded read got: at most `limit` bytes, and whether the file went on."""

    data: bytes
    truncated: bool


def read_prefix(path: NodePath, limit: int = DEFAULT_LIMIT) -> Contents:
    """The first `limit` bytes of a regular file, and whether there was more.

    ReadError names the path and the reason: missing, permission denied, a
    symlink loop, an I/O error, or a kind that is not a file ("a FIFO, not a
    file", "a directory, not a file", "a character device, not a file").
    """
    data, truncated = _read(path, limit)
    return Contents(data, truncated)


def _read(path: NodePath, limit: int) -> tuple[bytes, bool]:
    # As `with reading(path):`, inline: this runs for every file a pass reads.
    ident = get_ident()
    _in_flight[ident] = (path if isinstance(path, str) else str(path), monotonic())
    try:
        try:
            # The kind first: opening a device node is not harmless (/dev/watchdog arms
            # the watchdog, a tape rewinds: Documentation/watchdog/watchdog-api.rst), so
            # nothing but a regular file is opened; fstat below closes the race.
            kind = os.stat(path).st_mode
            if not stat.S_ISREG(kind):
                raise ReadError(path, describe_kind(kind))
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as err:
            raise ReadError(path, os_error_reason(err)) from err
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise ReadError(path, describe_kind(mode))
            chunks: list[bytes] = []
            total = 0
            # One byte past the limit tells a file of exactly `limit` bytes from a longer one.
            while total <= limit:
                chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        except OSError as err:
            raise ReadError(path, os_error_reason(err)) from err
        finally:
            os.close(fd)
    finally:
        _in_flight.pop(ident, None)
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return (data, False) if total <= limit else (data[:limit], True)


def _size(limit: int) -> str:
    if limit >= 1 << 20 and limit % (1 << 20) == 0:
        return f"{limit >> 20} MiB"
    if limit >= 1 << 10 and limit % (1 << 10) == 0:
        return f"{limit >> 10} KiB"
    return f"{limit} bytes"


def read_bytes(path: NodePath, limit: int = DEFAULT_LIMIT) -> bytes:
    """The whole of a regular file of at most `limit` bytes; ReadError names the path on
    any failure, a larger file included (use read_prefix to take the start of one)."""
    data, truncated = _read(path, limit)
    if truncated:
        raise ReadError(path, f"larger than {_size(limit)}: not what this file should hold")
    return data


# Control characters other than tab, newline and carriage return, and DEL.
_CONTROL_CHARACTER = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _binary_at(text: str) -> int | None:
    """Offset of the first control character other than tab, newline and carriage return."""
    found = _CONTROL_CHARACTER.search(text)
    return None if found is None else found.start()


def decode_text(path: NodePath, data: bytes) -> str:
    """UTF-8 text without control characters (sysfs and procfs print none), or ReadError."""
    try:
        text = data.decode()
    except UnicodeDecodeError as err:
        raise ReadError(path, f"binary content, not text (byte {err.start})") from err
    offset = _binary_at(text)
    if offset is not None:
        raise ReadError(path, f"binary content, not text ({text[offset]!r} at {offset})")
    return text


def read_text(path: NodePath, limit: int = DEFAULT_LIMIT) -> str:
    """Read a small text attribute, stripped of surrounding whitespace.

    Trailing NULs are padding, not content: since Linux 5.14 the cpulist and cpumap files
    of devices/system/node and cpu/*/topology are bin_attributes (drivers/base/node.c,
    drivers/base/topology.c) whose reads can end with the string's terminating NUL, as a
    real Kunpeng 920 capture on 5.15 shows ("0-31\n\0")."""
    return decode_text(path, read_bytes(path, limit).rstrip(b"\0")).strip()


def read_optional_text(path: NodePath) -> str | None:
    """Like read_text, but None when the file does not exist.

    Sysfs creates some attributes only where they apply (the PCIe link files
    exist for PCI Express devices only), so absence carries meaning there.
    """
    try:
        return read_text(path)
    except ReadError as err:
        if err.reason == MISSING:
            return None
        raise


def _shown(text: str) -> str:
    if not text:
        return "an empty file"
    return repr(text if len(text) <= 80 else text[:80] + "...")


def parse_attr(path: NodePath, text: str, parse: Callable[[str], T], expected: str) -> T:
    """Parse a file's text; a ReadError names the path and what it held when that fails."""
    try:
        return parse(text)
    except ImplausibleValueError as err:
        raise ReadError(path, f"{_shown(text)} is implausible: {err}") from err
    except ValueError as err:
        raise ReadError(path, f"expected {expected}, got {_shown(text)}") from err


def read_parsed(path: NodePath, parse: Callable[[str], T], expected: str) -> T:
    """read_text, then parse: "<path>: expected an integer, got 'x'" on bad content."""
    return parse_attr(path, read_text(path), parse, expected)


def read_optional_parsed(path: NodePath, parse: Callable[[str], T], expected: str) -> T | None:
    """read_parsed, but None when the file does not exist (sysfs leaves out attributes
    an architecture or an old kernel does not provide)."""
    text = read_optional_text(path)
    return None if text is None else parse_attr(path, text, parse, expected)


def list_dir(path: NodePath, limit: int = DIRECTORY_LIMIT) -> list[str]:
    """Sorted entries of a directory; [] when it does not exist. Anything else that is
    not a directory (a file, a FIFO, a symlink loop) is a ReadError naming the path."""
    entries: list[str] = []
    with reading(path):
        try:
            # scandir opens with O_DIRECTORY: a FIFO or a file fails at once (ENOTDIR).
            with os.scandir(path) as iterator:
                for entry in iterator:
                    entries.append(entry.name)
                    if len(entries) > limit:
                        raise ReadError(path, f"more than {limit} entries")
        except FileNotFoundError:
            return []
        except NotADirectoryError as err:
            raise ReadError(path, "not a directory") from err
        except OSError as err:
            raise ReadError(path, os_error_reason(err)) from err
    return sorted(entries)


def read_link(path: NodePath) -> str:
    """The target of a symlink; ReadError naming the path when it is none or unreadable."""
    try:
        return os.readlink(path)
    except OSError as err:
        if err.errno == errno.EINVAL:
            raise ReadError(path, "not a symlink") from err
        raise ReadError(path, os_error_reason(err)) from err


def resolve_inside(root: Path, absolute: str) -> Path:
    """`absolute` resolved as chroot(2) to `root` would: `..` stops at the root, and a
    symlink to an absolute target continues from the root, not from the host's /.

    Components that do not exist are kept as they are (the read then says "missing").
    More than MAX_SYMLINKS links is a ReadError naming the path: a loop.
    """
    pending = [part for part in absolute.split("/") if part]
    resolved: list[str] = []
    followed = 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        try:
            target = os.readlink(candidate)
        except OSError:
            resolved.append(part)  # not a symlink, or not there
            continue
        followed += 1
        if followed > MAX_SYMLINKS:
            raise ReadError(
                root.joinpath(*resolved, part, *pending),
                f"a symlink loop (more than {MAX_SYMLINKS} links, resolved inside {root})",
            )
        if target.startswith("/"):
            resolved = []
        pending = [piece for piece in target.split("/") if piece] + pending
    return root.joinpath(*resolved)


# write_atomically's temporaries: ".<name>.<writer>.<pid>.<random>.tmp", beside the file.
# <writer> tells whose pid it is: this boot of this host (the kernel's random boot_id,
# Documentation/admin-guide/sysctl/kernel.rst "random") and this PID namespace
# (/proc/self/ns/pid's inode, namespaces(7)), hashed to 12 hex digits. A pid means
# nothing on another node sharing the folder (a state directory on NFS), after a reboot
# or in another container, so only a temporary of this writer identity whose pid is gone
# is known to be abandoned; any other is abandoned once it is older than
# ABANDONED_TEMPORARY_S (a write takes milliseconds; an hour is beyond any live writer).
ABANDONED_TEMPORARY_S = 3600.0
_TEMPORARY_SUFFIX = ".tmp"
# pid_max is at most PID_MAX_LIMIT, 4194304 (include/linux/threads.h): seven digits, and
# never 0 (os.kill(0, ...) would signal our whole process group).
_TEMPORARY_TAIL = LazyPattern(r"\.([0-9a-f]{12})\.([1-9][0-9]{0,6})\.[a-z0-9_]+\.tmp")
# Versions before the writer-named temporaries used tempfile.mkstemp's default name,
# ".<name>.<8 random characters>" (CPython Lib/tempfile.py, _RandomNameSequence): those
# left by a kill -9 then carry no pid, so they are removed only once older than
# ABANDONED_TEMPORARY_S.
_UNNAMED_TEMPORARY_TAIL = LazyPattern(r"\.[a-z0-9_]{8}")


@functools.lru_cache(maxsize=1)
def _writer_identity() -> str | None:
    """This process's boot and PID namespace, as 12 hex digits; None when /proc cannot
    say (then no temporary is judged by its pid, only by its age)."""
    import hashlib

    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            boot = file.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except (OSError, UnicodeDecodeError):
        return None
    return hashlib.blake2b(f"{boot} {namespace}".encode(), digest_size=6).hexdigest()


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only whether the process exists (kill(2))
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def _abandoned(name: str, prefix: str, info: os.stat_result, writer: str | None) -> bool:
    """Whether `name` in the folder is a temporary of `prefix`'s file that no live writer
    will rename: older than ABANDONED_TEMPORARY_S, or this writer identity's with a pid
    that no longer exists. Never a live writer's (the pid exists, or it is another host's
    or namespace's and recent)."""
    found = _TEMPORARY_TAIL.fullmatch(name, len(prefix) - 1)
    unnamed = found is None and _UNNAMED_TEMPORARY_TAIL.fullmatch(name, len(prefix) - 1)
    if not (found or unnamed) or not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        return False  # not one of ours: another program's file, or another user's
    if time.time() - info.st_mtime > ABANDONED_TEMPORARY_S:
        return True
    return (
        found is not None and found.group(1) == writer and not _process_exists(int(found.group(2)))
    )


def _remove_abandoned_temporaries(path: Path) -> None:
    """Remove the temporaries of `path` that writers killed mid-write left beside it (kill
    -9 never runs their cleanup); a folder that cannot be listed is left to the write to
    report."""
    prefix = f".{path.name}."
    writer = _writer_identity()
    try:
        with os.scandir(path.parent) as entries:
            candidates = [entry for entry in entries if entry.name.startswith(prefix)]
            for entry in candidates:
                with contextlib.suppress(OSError):  # gone meanwhile (another writer's cleanup)
                    if _abandoned(entry.name, prefix, entry.stat(follow_symlinks=False), writer):
                        os.unlink(entry.path)
    except OSError:
        pass


def write_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace `path` with `text` so that a reader (or a crash) sees old or new, whole.

    A temporary beside it, fsync, rename(2) over it, fsync of the folder. The temporary is
    named for this writer (".<name>.<writer>.<pid>.<random>.tmp"), and the ones writers
    killed mid-write left are removed first (_remove_abandoned_temporaries). The folder
    must exist: nothing is created but the temporary.
    """
    import tempfile  # only writers need it: not every read of the node

    _remove_abandoned_temporaries(path)
    handle, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.{_writer_identity() or '0' * 12}.{os.getpid()}.",
        suffix=_TEMPORARY_SUFFIX,
        dir=path.parent,
    )
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


@record
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
        """A host path such as /etc/nccl.conf, under the root filesystem, never outside it.

        A path from the node (`NCCL_CONF_FILE=/../etc/shadow`, a home directory from
        `<rootfs>/etc/passwd`, a symlink to /etc/passwd in the tree) is resolved as
        chroot(2) to the root filesystem would: `..` stops at the root and absolute
        symlink targets continue inside it. A symlink loop is a ReadError naming it.
        """
        if self.rootfs == Path("/") or self.rootfs.resolve() == Path("/"):
            # normpath keeps a leading "//" (POSIX leaves it implementation-defined):
            # "/" + "/etc/nccl.conf" must become /etc/nccl.conf, not //etc/nccl.conf.
            return Path(posixpath.normpath("/" + absolute.lstrip("/")))
        return resolve_inside(self.rootfs, absolute)


# Regular files only, opened without side effects: the agent's configuration and PEM
# files, and captures (`--facts`), are read this way.
def file_kind(mode: int) -> str:
    """What a non-regular file is, as an operator would say it."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


class NotRegularFileError(Exception):
    """A path that is something other than a regular file: what it is, as file_kind says."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def open_regular_file(path: Path) -> int:
    """A read-only, non-blocking descriptor of the regular file at `path`.

    stat(2) first, and nothing but a regular file is opened: opening a device node has
    side effects of its own (/dev/watchdog arms the hardware watchdog, a tape device
    rewinds, a FIFO wakes a writer blocked in open(2): fifo(7)). fstat(2) after the open
    confirms it is still that file, should the path have been replaced in between.
    NotRegularFileError when it is not one; OSError (FileNotFoundError, ...) or
    ValueError (a NUL in the path) from the calls themselves.
    """
    before = os.stat(path)
    if not stat.S_ISREG(before.st_mode):
        raise NotRegularFileError(file_kind(before.st_mode))
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        after = os.fstat(descriptor)
    except OSError:
        os.close(descriptor)
        raise
    if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (
        before.st_dev,
        before.st_ino,
    ):
        os.close(descriptor)
        kind = file_kind(after.st_mode) if not stat.S_ISREG(after.st_mode) else "another file"
        raise NotRegularFileError(f"replaced while being opened (now {kind})")
    return descriptor


def read_regular_file(path: Path, limit: int) -> bytes:
    """The start of a regular file, one byte past `limit` at most, so a caller tells a file
    of `limit` bytes from a longer one; opened by open_regular_file (its errors, and
    OSError from the reads)."""
    descriptor = open_regular_file(path)
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= limit:
            chunk = os.read(descriptor, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(descriptor)
    return b"".join(chunks)
