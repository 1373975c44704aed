"""The NCCL versions installed on the node, where they can be read without loading NCCL:
the shared library's file name under the root filesystem, and torch's bundled NCCL from
its wheel's package metadata (torch is never imported).

Some defaults depend on the version: NCCL 2.21 and later find the RoCE v2 GID of a port
themselves, older ones take NCCL_IB_GID_INDEX's default, 0 (NCCL release notes 2.21;
NCCL docs, Environment Variables: NCCL_IB_GID_INDEX).

- A distribution's libnccl2 package (and NVIDIA's CUDA repositories) install the library
  as `libnccl.so.MAJOR.MINOR.PATCH`, with the soname `libnccl.so.MAJOR` a symlink to it;
  the full version is in the real file's name.
- pip's torch wheels for CUDA depend on `nvidia-nccl-cuXX`, whose library file is only
  `nvidia/nccl/lib/libnccl.so.2`: its version is the distribution's, in its metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from nodecheck.checks.node.fs import NodeFS, ReadError, list_dir
from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.record import record

if TYPE_CHECKING:
    # importlib.metadata costs `check` some 10-20 ms to import; only the live root reads it.
    from importlib import metadata

# Where distributions and NVIDIA's packages put libnccl (Debian/Ubuntu multiarch, RHEL's
# lib64, the CUDA toolkit's own directory).
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/sbsa-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/usr/local/cuda/lib64",
)
LIBRARY_NAME = LazyPattern(r"^libnccl\.so\.(\d+)\.(\d+)\.(\d+)$")
BUNDLED_NAME = LazyPattern(r"^nvidia-nccl-cu\d+$")
BUNDLED_VERSION = LazyPattern(r"^(\d+)\.(\d+)\.(\d+)")
GID_DISCOVERY = (2, 21)  # NCCL finds the RoCE v2 GID itself from this release


@record
class NcclLibrary:
    version: tuple[int, int, int]
    where: str  # the host path, or the wheel's name as pip lists it

    @property
    def text(self) -> str:
        return f"NCCL {'.'.join(map(str, self.version))} ({self.where})"

    @property
    def finds_gid(self) -> bool:
        return self.version[:2] >= GID_DISCOVERY


@record
class NcclLibraries:
    found: tuple[NcclLibrary, ...]
    problems: tuple[str, ...]  # directories that could not be listed, naming the path

    @property
    def without_gid_discovery(self) -> list[NcclLibrary]:
        return [library for library in self.found if not library.finds_gid]


def installed_libraries(fs: NodeFS) -> tuple[list[NcclLibrary], list[str]]:
    """libnccl.so.X.Y.Z files in the usual library directories under the root filesystem."""
    found: list[NcclLibrary] = []
    problems: list[str] = []
    for directory in LIBRARY_DIRS:
        path = fs.host(directory)
        try:
            names = list_dir(path)
        except ReadError as err:
            problems.append(str(err))
            continue
        for name in names:
            match = LIBRARY_NAME.match(name)
            if match:
                major, minor, patch = (int(part) for part in match.groups())
                found.append(NcclLibrary((major, minor, patch), f"{directory}/{name}"))
    return found, problems


def bundled_libraries(
    distributions: Iterable[metadata.Distribution] | None = None,
) -> list[NcclLibrary]:
    """torch's NCCL from pip (nvidia-nccl-cu12 and its kin), from package metadata only."""
    from importlib import metadata

    chosen = metadata.distributions() if distributions is None else distributions
    found = []
    for distribution in chosen:
        name = (distribution.metadata["Name"] or "").lower().replace("_", "-")
        match = BUNDLED_VERSION.match(distribution.version or "")
        if BUNDLED_NAME.match(name) and match:
            major, minor, patch = (int(part) for part in match.groups())
            found.append(NcclLibrary((major, minor, patch), f"pip package {name}"))
    return found


def read_nccl_libraries(
    fs: NodeFS, distributions: Iterable[metadata.Distribution] | None = None
) -> NcclLibraries:
    """Every NCCL that can be read; none found says nothing about the node (a container or
    a virtualenv may carry its own), so callers say "not found", never "absent". This
    Python's packages (`distributions` in tests) count only on the node's own root."""
    installed, problems = installed_libraries(fs)
    # This Python's packages are the node's only when nodecheck reads its own root.
    own_root = fs.rootfs == Path("/") or fs.rootfs.resolve() == Path("/")
    bundled = bundled_libraries(distributions) if distributions is not None or own_root else []
    unique = list(dict.fromkeys([*installed, *bundled]))
    return NcclLibraries(tuple(unique), tuple(problems))
