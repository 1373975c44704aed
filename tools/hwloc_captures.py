"""hwloc's Linux test captures (`tests/hwloc/linux/` of open-mpi/hwloc), unpacked for reading.

Each capture is `NAME.tar.bz2` (a `/sys` and usually `/proc` tree, sometimes one
folder down) beside `NAME.test`, whose `target:` line names hwloc's own reading
of it (`NAME.console` or `NAME.xml`). This module only finds and unpacks them;
`tools.compare_hwloc` compares nodecheck's reading with hwloc's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

# Where the captures live unless NODECHECK_REAL_DATA names another folder: a
# checkout's sibling `shared/real` (the layout of the machines this project is
# developed on; users do not have it, and tests that need it skip without it).
DEFAULT_REAL_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "real"


def real_data_dir() -> Path | None:
    """The folder of real captures, or None where this machine has none."""
    configured = os.environ.get("NODECHECK_REAL_DATA")
    folder = Path(configured) if configured else DEFAULT_REAL_DATA
    return folder if folder.is_dir() else None


@dataclass(frozen=True)
class Capture:
    name: str
    archive: Path
    description: Path  # NAME.test

    @property
    def target(self) -> Path | None:
        """hwloc's expected reading named by the .test file's `target:` line."""
        for line in self.description.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "target" and value.strip():
                return self.description.parent / value.strip()
        return None


def list_captures(folder: Path) -> list[Capture]:
    """Every NAME.tar.bz2 with its NAME.test, sorted by name."""
    captures = []
    for archive in sorted(folder.glob("*.tar.bz2")):
        name = archive.name.removesuffix(".tar.bz2")
        captures.append(Capture(name, archive, folder / f"{name}.test"))
    return captures


def unpack(capture: Capture, into: Path) -> Path:
    """Unpack the capture under `into/NAME` and return the folder that holds its `sys/`.

    The archives hold relative symlinks (sysfs's own, from `bus/` and `class/`
    into `devices/`), which both ways below keep. GNU tar unpacks the 95,000
    entries of all 33 in about 2 s where Python's tarfile takes 15; tarfile
    (whose "tar" filter refuses absolute member names and device files) is
    the fallback where there is no tar.
    """
    destination = into / capture.name
    if not destination.exists():
        destination.mkdir(parents=True)
        tar = shutil.which("tar")
        if tar:
            subprocess.run(
                [tar, "-xjf", str(capture.archive), "--no-same-owner", "-C", str(destination)],
                check=True,
                capture_output=True,
            )
        else:
            with tarfile.open(capture.archive) as archive:
                archive.extractall(destination, filter="tar")
    return capture_root(destination)


def capture_root(folder: Path) -> Path:
    """The folder that holds `sys/`: the unpacked folder itself or one below it."""
    if (folder / "sys").is_dir():
        return folder
    for child in sorted(folder.iterdir()):
        if (child / "sys").is_dir():
            return child
    return folder
