"""The torch version read from package metadata, on literal folders and files, and
held against importlib.metadata for the torch installed beside the tests."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from nodecheck.checks.node.torch_package import (
    distribution_name,
    find_distribution_version,
    metadata_version,
    read_torch_version,
)


@pytest.mark.parametrize(
    ("folder", "name"),
    [
        ("torch-2.9.1+cu128.dist-info", "torch"),
        ("torch-2.13.0+cpu.dist-info", "torch"),
        ("Torch.egg-info", "torch"),
        ("torch-2.1.0-py3.11.egg-info", "torch"),
        ("torchvision-0.24.0.dist-info", "torchvision"),
        ("torch_tensorrt-2.9.0.dist-info", "torch-tensorrt"),
        ("nvidia_nccl_cu12-2.27.3.dist-info", "nvidia-nccl-cu12"),
        ("torch", None),
        ("torch-2.9.1.data", None),
    ],
)
def test_distribution_name(folder: str, name: str | None) -> None:
    assert distribution_name(folder) == name


def test_metadata_version_reads_the_header_only() -> None:
    text = (
        "Metadata-Version: 2.4\nName: torch\nVersion: 2.9.1+cu128\nSummary: Tensors\n\n"
        "Version: 0.0 in the description\n"
    )
    assert metadata_version(text) == "2.9.1+cu128"
    assert metadata_version("Name: torch\n\nVersion: 1.0\n") is None
    assert metadata_version("Name: torch\nVersion:\n") is None


def _distribution(site: Path, folder: str, version: str, file: str = "METADATA") -> None:
    (site / folder).mkdir(parents=True)
    (site / folder / file).write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")


def test_the_first_folder_on_the_path_wins_and_others_are_not_torch(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _distribution(first, "torchvision-0.24.0.dist-info", "0.24.0")
    _distribution(first, "torch_tensorrt-2.9.0.dist-info", "2.9.0")
    _distribution(second, "torch-2.9.1+cu128.dist-info", "2.9.1+cu128")
    _distribution(tmp_path / "third", "torch-2.5.0.dist-info", "2.5.0")
    path = [str(tmp_path / "missing"), str(tmp_path / "a-file"), str(first), str(second)]
    (tmp_path / "a-file").write_text("")
    found = read_torch_version([*path, str(tmp_path / "third")])
    assert (found.version, found.text) == ((2, 9), "2.9.1+cu128")


def test_an_egg_info_develop_install(tmp_path: Path) -> None:
    _distribution(tmp_path, "torch.egg-info", "2.10.0a0+git1234", file="PKG-INFO")
    assert read_torch_version([str(tmp_path)]).version == (2, 10)


def test_a_folder_without_metadata_is_passed_over(tmp_path: Path) -> None:
    (tmp_path / "a" / "torch-2.9.1.dist-info").mkdir(parents=True)
    _distribution(tmp_path / "b", "torch-2.8.0.dist-info", "2.8.0")
    assert find_distribution_version("torch", [str(tmp_path / "a"), str(tmp_path / "b")]) == "2.8.0"


def test_no_torch_is_no_version(tmp_path: Path) -> None:
    found = read_torch_version([str(tmp_path)])
    assert (found.version, found.text) == (None, "")


def test_agrees_with_importlib_metadata_for_the_installed_torch() -> None:
    expected = metadata.version("torch")
    assert read_torch_version().text == expected
    assert find_distribution_version("click", sys.path) == metadata.version("click")
