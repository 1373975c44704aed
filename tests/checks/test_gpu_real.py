"""The GPU checks on a real GPU, against nvidia-smi. Skipped on machines without one.

Run on a GPU machine with `pytest -m gpu`. Each test runs `nodecheck` in a
subprocess so the real libnvidia-ml.so.1 is loaded there, never mixed with the
fake one the other tests load into this process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from nodecheck.checks.registry import checks_in
from tests.conftest import CLEAN_ENVIRON

GPU_CHECKS = tuple(checks_in("nodecheck.checks.gpu"))


def _nvidia_smi(*args: str) -> str | None:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        done = subprocess.run(
            [binary, *args], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


HAS_GPU = bool((_nvidia_smi("-L") or "").strip())
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAS_GPU, reason="no NVIDIA GPU (nvidia-smi -L lists none)"),
]


def nodecheck(*args: str) -> Any:
    environ = dict(CLEAN_ENVIRON, PATH=os.environ["PATH"])
    if "PYTHONPATH" in os.environ:
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    done = subprocess.run(
        [sys.executable, "-m", "nodecheck.agent", *args, "--json"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1, 3), done.stderr
    return json.loads(done.stdout)


def smi_gpus() -> dict[str, dict[str, str]]:
    """nvidia-smi's view by bus id (normalised as sysfs writes it)."""
    fields = "pci.bus_id,uuid,name,memory.total,power.default_limit,vbios_version"
    text = _nvidia_smi(f"--query-gpu={fields}", "--format=csv,noheader,nounits") or ""
    gpus = {}
    for line in text.strip().splitlines():
        bus, uuid, name, memory, default_limit, vbios = (c.strip() for c in line.split(","))
        domain, rest = bus.lower().split(":", 1)
        key = f"{int(domain, 16):04x}:{rest}"
        gpus[key] = {
            "uuid": uuid,
            "name": name,
            "memory_mib": memory,
            "default_limit_w": default_limit,
            "vbios": vbios,
        }
    return gpus


def test_inventory_matches_nvidia_smi() -> None:
    document = nodecheck("inventory")
    assert document["nvml"]["available"], document["nvml"]
    seen = {gpu["bus_id"]: gpu["nvml"] for gpu in document["gpus"] if gpu["nvml"]}
    expected = smi_gpus()
    assert set(seen) == set(expected)
    for bus_id, smi in expected.items():
        mine = seen[bus_id]
        assert mine["uuid"] == smi["uuid"]
        assert mine["name"] == smi["name"]
        assert mine["vbios"].upper() == smi["vbios"].upper()
        assert round(mine["memory_total_bytes"] / 2**20) == int(smi["memory_mib"])


def test_gpu_checks_complete_and_count_matches() -> None:
    document = nodecheck("check", *(f"--only={n}" for n in GPU_CHECKS))
    results = document["results"]
    checks = {r["check"] for r in results}
    assert checks == set(GPU_CHECKS)
    assert not [r for r in results if "did not finish" in r["summary"]]
    assert not [r for r in results if r["summary"].startswith("NVML did not answer")]
    [count] = [r for r in results if r["check"] == "gpu_count" and r["subject"] == "node"]
    assert count["status"] == "ok", count
    assert count["details"]["visible_to_nvml"] == len(smi_gpus())


def test_state_matches_nvidia_smi() -> None:
    document = nodecheck("check", "--only=gpu_state")
    expected = smi_gpus()
    per_gpu = {
        r["subject"].removeprefix("gpu "): r["details"]
        for r in document["results"]
        if r["subject"].startswith("gpu ")
    }
    assert set(per_gpu) == set(expected)
    for bus_id, details in per_gpu.items():
        assert details["uuid"] == expected[bus_id]["uuid"]
        assert 0 < details["temperature_c"] < 120
        assert details["power_w"] >= 0
