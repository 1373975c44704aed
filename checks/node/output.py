"""Where nodecheck writes what it is pointed at: one rule for every output path.

`capture -o`, `snapshot --output`, the agent's results_file and textfile_dir, and the
benchmark state directory (`bench --state-dir`, state_dir) all follow it:

- The folder must exist: nodecheck creates no folder for a path it is given, only its
  own default ones (the benchmark state directory, the snapshot's /run/nodecheck).
- Nothing there yet, or a regular file: replaced atomically (write_atomically), with the
  writer's mode (a capture 0600).
- A FIFO, a terminal or the null device (1:3, devices.txt of the kernel's
  Documentation/admin-guide): written through, opened for writing and never created,
  truncated or replaced (`-o /dev/null` leaves /dev/null as it is). A FIFO that no one
  reads is refused at once: open(2) with O_NONBLOCK fails with ENXIO then (fifo(7)),
  where a plain open would wait for a reader forever. Any other character device is
  refused: opening /dev/watchdog arms the watchdog (the kernel's
  Documentation/watchdog/watchdog-api.rst), /dev/mem or /dev/port writes hardware.
- One of this process's descriptors (`/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N`,
  through any symlinks): written to that open descriptor itself, so `-o /dev/stdout >>
  log` appends to the shell's file and `> file` fills it, never replacing or truncating
  the file behind it (a reopen of /proc/self/fd/N would start at offset 0, a rename
  would replace another user's file with root's).
- A symlink is never replaced. One whose final target is a FIFO or a device as above is
  written through; one to a regular file has that file replaced atomically, and the
  writer says so; a dangling symlink, a loop, or one to anything else is refused. A
  symlink in a sticky world-writable folder (/tmp) owned by another user than the
  writer and the folder's owner is not followed: the rule of fs.protected_symlinks
  (the kernel's Documentation/admin-guide/sysctl/fs.rst), kept where that sysctl is 0,
  so no user can point root's capture at a file of root's to destroy it.
- Anything else in place (a directory, a socket, a block device: a disk) is refused.

A refusal is an OutputPathError, an OSError whose message names what is wrong, so every
writer's "cannot write <path>: <reason>" covers it with the errors of the write itself.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from pathlib import Path

from nodecheck.checks.node.fs import file_kind, os_error_reason, write_atomically
from nodecheck.checks.record import record

NO_SUCH_DIRECTORY = "no such directory"
NULL_DEVICE = (1, 3)  # major, minor of /dev/null (the kernel's devices.txt)
# Terminals by major number (devices.txt): 4 the virtual consoles and serial ports, 5
# /dev/tty, /dev/console and /dev/ptmx, 136-143 the Unix98 pseudo-terminals (/dev/pts).
# Known before any open: opening some devices acts (a watchdog arms).
TERMINAL_MAJORS = frozenset({4, 5, *range(136, 144)})
MAX_SYMLINKS = 40  # as the kernel's path walk (path_resolution(7))
OWN_DESCRIPTOR = re.compile(rf"^/(?:proc/(?:self|thread-self|{os.getpid()})/fd|dev/fd)/(\d+)$")


class OutputPathError(OSError):
    """The output path is nothing nodecheck may write; the message says why.

    `missing_folder` when the folder it would be in does not exist (an agent not
    installed as a service has no /run/nodecheck/agent: said once, quietly)."""

    def __init__(self, reason: str, *, missing_folder: bool = False) -> None:
        super().__init__(reason)
        self.missing_folder = missing_folder


@record
class Written:
    """Where the text went: `path` is the file written, the final target when the output
    path was a symlink to a regular file; `through` when it was written through a
    character device or a FIFO rather than replaced."""

    path: Path
    through: bool = False
    descriptor: int | None = None  # one of this process's own, written to as it is


def _kind(mode: int) -> str:
    return "a regular file" if stat.S_ISREG(mode) else file_kind(mode)


def output_directory_problem(path: Path, *, writable: bool = False) -> str | None:
    """None when `path` is a directory (or a symlink to one) to write in, else why not,
    without the path: "no such directory", "a regular file, not a directory", and with
    `writable`, "not writable by this user (uid N)"."""
    try:
        mode = os.stat(path).st_mode
    except ValueError:
        return "the path has a NUL character"
    except OSError as err:
        return NO_SUCH_DIRECTORY if err.errno == errno.ENOENT else os_error_reason(err)
    if not stat.S_ISDIR(mode):
        return f"{_kind(mode)}, not a directory"
    if writable and not os.access(path, os.W_OK | os.X_OK):
        return f"not writable by this user (uid {os.geteuid()})"
    return None


def _destination(path: Path) -> Written:
    """Where the rule sends a write to `path`, before anything is written: the file to
    replace atomically, or the device or FIFO to write through; OutputPathError when the
    rule refuses."""
    try:
        own = os.lstat(path)
    except ValueError:
        raise OutputPathError("the path has a NUL character") from None
    except FileNotFoundError:
        problem = output_directory_problem(path.parent)
        if problem is not None:
            # Never made here: mkdir of a path someone typed, as root, creates folders
            # anywhere.
            missing = problem == NO_SUCH_DIRECTORY
            raise OutputPathError(f"{path.parent}: {problem}", missing_folder=missing) from None
        return Written(path)
    except OSError as err:
        raise OutputPathError(os_error_reason(err)) from None
    descriptor = _own_descriptor(path)
    if descriptor is not None:
        try:
            os.fstat(descriptor)
        except OSError as err:
            raise OutputPathError(f"descriptor {descriptor}: {os_error_reason(err)}") from None
        return Written(path, through=True, descriptor=descriptor)
    if not stat.S_ISLNK(own.st_mode):
        if stat.S_ISREG(own.st_mode):
            return Written(path)
        if stat.S_ISFIFO(own.st_mode) or _a_device_to_write(own):
            return Written(path, through=True)
        raise _refusal(own.st_mode)
    _refuse_a_planted_symlink(path)
    try:
        final = os.stat(path)
    except OSError as err:
        if err.errno == errno.ENOENT:
            leads_to = os.readlink(path)
            raise OutputPathError(
                f"a symlink to {leads_to}, which does not exist: nodecheck replaces no symlink"
            ) from None
        raise OutputPathError(
            f"a symlink that cannot be followed: {os_error_reason(err)}"
        ) from None
    if stat.S_ISFIFO(final.st_mode) or _a_device_to_write(final):
        return Written(path, through=True)
    if not stat.S_ISREG(final.st_mode):
        raise _refusal(final.st_mode, via="a symlink to ")
    # The symlink stays; the file it leads to is replaced. realpath names that file,
    # unless the link goes through a /proc magic link whose text is no path
    # (/proc/self/fd/N of a deleted file): the same inode, or a refusal.
    target = Path(os.path.realpath(path))
    try:
        named = os.stat(target)
    except OSError:
        named = None
    if named is None or (named.st_dev, named.st_ino) != (final.st_dev, final.st_ino):
        raise OutputPathError("a symlink to a file that has no path of its own to replace")
    return Written(target)


def _a_device_to_write(status: os.stat_result) -> bool:
    """True for /dev/null and a terminal; OutputPathError for any other character
    device; False for what is no character device."""
    if not stat.S_ISCHR(status.st_mode):
        return False
    device = (os.major(status.st_rdev), os.minor(status.st_rdev))
    if device == NULL_DEVICE or device[0] in TERMINAL_MAJORS:
        return True
    raise OutputPathError(
        f"a character device ({device[0]}:{device[1]}) that is neither a terminal nor "
        "/dev/null: nodecheck writes no other device"
    )


def _own_descriptor(path: Path) -> int | None:
    """The descriptor number when `path`, or a symlink on its way, is one of this
    process's own descriptors (/dev/stdout -> /proc/self/fd/1), else None."""
    current = Path(os.path.abspath(path))
    for _ in range(MAX_SYMLINKS):
        match = OWN_DESCRIPTOR.match(str(current))
        if match:
            return int(match.group(1))
        try:
            target = os.readlink(current)
        except OSError:
            return None  # not a symlink (or gone): the rest of the rule judges it
        current = Path(os.path.normpath(current.parent / target))
    return None


def _refuse_a_planted_symlink(path: Path) -> None:
    """fs.protected_symlinks' rule: a symlink in a sticky world-writable folder is
    followed only by its owner, or when it belongs to the folder's owner."""
    link = os.lstat(path)
    try:
        folder = os.stat(path.parent)
    except OSError as err:
        raise OutputPathError(f"{path.parent}: {os_error_reason(err)}") from None
    sticky_world_writable = folder.st_mode & stat.S_ISVTX and folder.st_mode & stat.S_IWOTH
    if sticky_world_writable and link.st_uid not in (os.geteuid(), folder.st_uid):
        raise OutputPathError(
            f"a symlink of another user's (uid {link.st_uid}) in a sticky world-writable "
            "folder: not followed (fs.protected_symlinks' rule)"
        )


def _refusal(mode: int, *, via: str = "") -> OutputPathError:
    what = _kind(mode)
    if stat.S_ISBLK(mode):
        what += " (a disk)"
    return OutputPathError(f"{via}{what}, not a file nodecheck may replace or write through")


def write_output(path: Path, text: str, mode: int) -> Written:
    """Write `text` to the output path `path` by the rule above: a file replaced
    atomically with `mode`, or a device or FIFO written through; OutputPathError when the
    rule refuses, OSError from the write itself."""
    destination = _destination(path)
    if destination.descriptor is not None:
        _write_all(destination.descriptor, text.encode())
    elif destination.through:
        _write_through(path, text.encode())
    else:
        write_atomically(destination.path, text, mode)
    return destination


def _write_through(path: Path, data: bytes) -> None:
    """Write `data` into the character device or FIFO at `path`, as it is.

    No O_CREAT or O_TRUNC: nothing is made or emptied. O_NONBLOCK for the open only, so a
    FIFO without a reader is ENXIO at once (fifo(7)); then the writes block as usual, for
    the reader to drain the pipe. O_NOCTTY: a terminal opened by a process without one
    (a root service) must not become its controlling terminal (open(2)). fstat(2) after
    the open refuses a path replaced since it was looked at (a regular file now would
    be overwritten in place, not replaced)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        fifo = False
        with contextlib.suppress(OSError):
            fifo = stat.S_ISFIFO(os.stat(path).st_mode)
        if err.errno == errno.ENXIO and fifo:
            raise OutputPathError("a FIFO with no reader (nothing has it open to read)") from None
        raise OutputPathError(os_error_reason(err)) from None
    try:
        opened = os.fstat(descriptor)
        if not (stat.S_ISCHR(opened.st_mode) or stat.S_ISFIFO(opened.st_mode)):
            raise OutputPathError(f"replaced while being opened (now {_kind(opened.st_mode)})")
        device = (os.major(opened.st_rdev), os.minor(opened.st_rdev))
        if stat.S_ISCHR(opened.st_mode) and device != NULL_DEVICE and not os.isatty(descriptor):
            raise OutputPathError(
                f"a character device ({device[0]}:{device[1]}) that is neither a terminal nor "
                "/dev/null: nodecheck writes no device"
            )
        flags = fcntl.fcntl(descriptor, fcntl.F_GETFL)
        fcntl.fcntl(descriptor, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        _write_all(descriptor, data)
    finally:
        os.close(descriptor)


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]
