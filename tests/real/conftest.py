"""Real machines' captures, unpacked once per session; every test here skips without them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.hwloc_captures import (
    DEFAULT_REAL_DATA,
    Capture,
    list_captures,
    real_data_dir,
    unpack,
)


@pytest.fixture(scope="session")
def real_data() -> Path:
    folder = real_data_dir()
    if folder is None:
        pytest.skip(
            f"no real captures here ({DEFAULT_REAL_DATA}, or a folder named by "
            "NODECHECK_REAL_DATA): "
            "the quirk fixtures in tests/fixtures cover their classes"
        )
    return folder


@pytest.fixture(scope="session")
def hwloc_captures(real_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Capture name -> the unpacked folder holding its sys/ (and proc/)."""
    into = tmp_path_factory.mktemp("hwloc")
    captures: list[Capture] = list_captures(real_data / "hwloc")
    return {capture.name: unpack(capture, into) for capture in captures}
