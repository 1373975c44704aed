"""The fake NVML library, driven through the real nvidia-ml-py bindings.

Every check runs in a subprocess (the library is found through LD_LIBRARY_PATH)
so the state of the libraries loaded into the pytest process is never touched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.fake_nvml.build import LIB_NAME, build_fake_nvml, find_nvml_header

# Return codes, as in nvml.h.
SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION = 0, 1, 2, 3, 4
NOT_FOUND, INSUFFICIENT_SIZE, DRIVER_NOT_LOADED, TIMEOUT, GPU_IS_LOST = 6, 7, 9, 10, 15
LIB_RM_VERSION_MISMATCH, ARGUMENT_VERSION_MISMATCH, UNKNOWN = 18, 25, 999

# Runs before every snippet: `n` is pynvml, `rc(f, *args)` is the return code of a call,
# `out` is printed as JSON at the end.
PRELUDE = """
import ctypes, json, os, sys, threading, time
import pynvml as n

def rc(fn, *args):
    try:
        fn(*args)
    except n.NVMLError as e:
        return e.value
    return 0

out = {}
"""

HEALTHY: dict[str, Any] = {
    "gpus": [
        {"bus_id": "0000:1b:00.0"},
        {"bus_id": "0000:2a:00.0", "visible": False},
        {
            "bus_id": "0000:3D:00.0",
            "uuid": "GPU-12345678-abcd-ef01-2345-6789abcdef01",
            "serial": "1654321098765",
            "minor": 7,
            "nvlink": {"links": 0},
        },
    ]
}


class Fake:
    """Runs Python snippets against the fake library with a given scenario."""

    def __init__(self, lib_dir: Path, tmp_path: Path) -> None:
        self.lib_dir = lib_dir
        self.tmp_path = tmp_path
        self.count = 0

    def scenario(self, doc: Mapping[str, Any] | str) -> Path:
        """Writes a scenario file (a dict is dumped as JSON, a str written as is)."""
        self.count += 1
        path = self.tmp_path / f"scenario{self.count}.json"
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        return path

    def run(
        self,
        scenario: Mapping[str, Any] | str | Path | None,
        body: str,
        *,
        in_process: bool = False,
        extra_env: Mapping[str, str] | None = None,
    ) -> tuple[dict[str, Any], str]:
        """Runs PRELUDE + body in a fresh interpreter; returns (out, stderr)."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if not in_process:
            env["LD_LIBRARY_PATH"] = str(self.lib_dir)
        if scenario is not None:
            path = scenario if isinstance(scenario, Path) else self.scenario(scenario)
            env["FAKE_NVML_SCENARIO"] = str(path)
        env.update(extra_env or {})
        code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


@pytest.fixture(scope="session")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("fake_nvml")).parent


@pytest.fixture
def fake(lib_dir: Path, tmp_path: Path) -> Fake:
    return Fake(lib_dir, tmp_path)


def gpu(**keys: Any) -> dict[str, Any]:
    """A scenario with one GPU at 0000:18:00.0 and the given keys."""
    return {"gpus": [{"bus_id": "0000:18:00.0", **keys}]}


# ---- build -------------------------------------------------------------------------------


def test_build_is_cached_by_stamp(lib_dir: Path) -> None:
    lib = lib_dir / LIB_NAME
    before = lib.stat().st_mtime_ns
    assert build_fake_nvml(lib_dir) == lib
    assert lib.stat().st_mtime_ns == before
    assert find_nvml_header().name == "nvml.h"


# ---- healthy node --------------------------------------------------------------------------


HEALTHY_PROBE = """
n.nvmlInit()
out["driver"] = n.nvmlSystemGetDriverVersion()
out["nvml"] = n.nvmlSystemGetNVMLVersion()
out["cuda"] = [n.nvmlSystemGetCudaDriverVersion(), n.nvmlSystemGetCudaDriverVersion_v2()]
out["count"] = n.nvmlDeviceGetCount()
gpus = []
for i in range(out["count"]):
    h = n.nvmlDeviceGetHandleByIndex(i)
    pci = n.nvmlDeviceGetPciInfo(h)
    mem = n.nvmlDeviceGetMemoryInfo(h)
    mem2 = n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)
    util = n.nvmlDeviceGetUtilizationRates(h)
    fields = n.nvmlDeviceGetFieldValues(h, [91, 38, 94, 95, 142, 144, 230, 74, 270, 12345])
    gpus.append({
        "busId": pci.busId, "busIdLegacy": pci.busIdLegacy,
        "busId_raw": repr(ctypes.string_at(ctypes.addressof(pci) + type(pci).busId.offset)),
        "pci": [pci.domain, pci.bus, pci.device, pci.pciDeviceId, pci.pciSubSystemId],
        "index": n.nvmlDeviceGetIndex(h), "minor": n.nvmlDeviceGetMinorNumber(h),
        "name": n.nvmlDeviceGetName(h), "uuid": n.nvmlDeviceGetUUID(h),
        "serial": n.nvmlDeviceGetSerial(h), "vbios": n.nvmlDeviceGetVbiosVersion(h),
        "mem": [mem.total, mem.used, mem.free], "mem2": [mem2.total, mem2.reserved, mem2.used],
        "ecc_mode": n.nvmlDeviceGetEccMode(h),
        "ecc": n.nvmlDeviceGetTotalEccErrors(h, 1, 1),
        "remapped": n.nvmlDeviceGetRemappedRows(h),
        "pages": n.nvmlDeviceGetRetiredPages(h, 0),
        "pages_pending": n.nvmlDeviceGetRetiredPagesPendingStatus(h),
        "reasons": [n.nvmlDeviceGetCurrentClocksEventReasons(h),
                    n.nvmlDeviceGetSupportedClocksEventReasons(h),
                    n.nvmlDeviceGetCurrentClocksThrottleReasons(h)],
        "pcie": [n.nvmlDeviceGetCurrPcieLinkGeneration(h), n.nvmlDeviceGetMaxPcieLinkGeneration(h),
                 n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h), n.nvmlDeviceGetCurrPcieLinkWidth(h),
                 n.nvmlDeviceGetMaxPcieLinkWidth(h), n.nvmlDeviceGetPcieReplayCounter(h)],
        "nvlink": [rc(n.nvmlDeviceGetNvLinkState, h, 0), rc(n.nvmlDeviceGetNvLinkState, h, 18)],
        "temp": [n.nvmlDeviceGetTemperatureV(h, 0), n.nvmlDeviceGetTemperature(h, 0)]
                + [n.nvmlDeviceGetTemperatureThreshold(h, t) for t in range(4)],
        "power": [n.nvmlDeviceGetPowerUsage(h), n.nvmlDeviceGetEnforcedPowerLimit(h),
                  n.nvmlDeviceGetPowerManagementLimit(h),
                  n.nvmlDeviceGetPowerManagementDefaultLimit(h)],
        "persistence": n.nvmlDeviceGetPersistenceMode(h),
        "util": [util.gpu, util.memory],
        "procs": [len(n.nvmlDeviceGetComputeRunningProcesses(h)),
                  len(n.nvmlDeviceGetGraphicsRunningProcesses(h))],
        "arch": n.nvmlDeviceGetArchitecture(h), "cc": n.nvmlDeviceGetCudaComputeCapability(h),
        "pstate": n.nvmlDeviceGetPerformanceState(h),
        "clocks": [n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                   n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM),
                   n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)],
        "events": n.nvmlDeviceGetSupportedEventTypes(h),
        "fields": {f.fieldId: [f.nvmlReturn, f.valueType] for f in fields},
        "field_values": {f.fieldId: (f.value.ullVal if f.valueType == 3 else f.value.uiVal)
                         for f in fields if f.nvmlReturn == 0},
    })
out["gpus"] = gpus
by_bus = [n.nvmlDeviceGetHandleByPciBusId(b) for b in
          ["0000:1b:00.0", "00000000:1B:00.0", "0000:3d:00.0"]]
out["by_bus"] = [n.nvmlDeviceGetIndex(h) for h in by_bus]
out["by_uuid"] = n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(gpus[1]["uuid"]))
out["invisible"] = rc(n.nvmlDeviceGetHandleByPciBusId, "0000:2a:00.0")
out["absent"] = rc(n.nvmlDeviceGetHandleByPciBusId, "0000:99:00.0")
out["malformed"] = rc(n.nvmlDeviceGetHandleByPciBusId, "1b:00.0")
out["bad_index"] = rc(n.nvmlDeviceGetHandleByIndex, 2)
out["errstr"] = [n.nvmlErrorString(c) for c in (0, 3, 15, 999, 12345)]
n.nvmlShutdown()
out["after_shutdown"] = rc(n.nvmlDeviceGetCount)
"""


@pytest.fixture(scope="module")
def healthy(lib_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    fake = Fake(lib_dir, tmp_path_factory.mktemp("healthy"))
    return fake.run(HEALTHY, HEALTHY_PROBE)[0]


def test_system_values(healthy: dict[str, Any]) -> None:
    assert healthy["driver"] == "570.124.06"
    assert healthy["nvml"] == "12.570.124.06"
    assert healthy["cuda"] == [12080, 12080]
    assert healthy["errstr"] == [
        "Success",
        "Not Supported",
        "GPU is lost",
        "Unknown Error",
        "Unknown Error",
    ]
    assert healthy["after_shutdown"] == UNINITIALIZED


def test_enumeration_and_bus_id(healthy: dict[str, Any]) -> None:
    assert healthy["count"] == 2  # the invisible GPU is not enumerated
    first, second = healthy["gpus"]
    # The struct holds b"00000000:1B:00.0"; this pynvml decodes char arrays to str.
    assert first["busId_raw"] == repr(b"00000000:1B:00.0")
    assert first["busId"] == "00000000:1B:00.0"
    assert first["busIdLegacy"] == "0000:1B:00.0"
    assert first["pci"] == [0, 0x1B, 0, 0x233010DE, 0x16C110DE]
    assert second["busId"] == "00000000:3D:00.0"
    assert [first["index"], first["minor"], second["index"], second["minor"]] == [0, 0, 1, 7]
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", first["uuid"])
    assert second["uuid"] == "GPU-12345678-abcd-ef01-2345-6789abcdef01"
    assert second["serial"] == "1654321098765"
    assert first["serial"] != second["serial"]
    assert healthy["by_bus"] == [0, 0, 1]
    assert healthy["by_uuid"] == 1
    assert healthy["absent"] == NOT_FOUND
    assert healthy["malformed"] == INVALID_ARGUMENT
    assert healthy["bad_index"] == INVALID_ARGUMENT


def test_invisible_gpu(healthy: dict[str, Any]) -> None:
    assert healthy["invisible"] == NOT_FOUND
    assert all(g["busIdLegacy"] != "0000:2A:00.0" for g in healthy["gpus"])


def test_healthy_defaults(healthy: dict[str, Any]) -> None:
    g = healthy["gpus"][0]
    assert g["name"] == "NVIDIA H100 80GB HBM3"
    assert g["vbios"] == "96.00.99.00.01"
    assert g["mem"] == [85520809984, 529530880, 85520809984 - 529530880]
    assert g["mem2"] == [85520809984, 0, 529530880]
    assert g["ecc_mode"] == [1, 1]
    assert g["ecc"] == 0
    assert g["remapped"] == [0, 0, 0, 0]
    assert g["pages"] == []
    assert g["pages_pending"] == 0
    assert g["reasons"] == [1, 0x1FF, 1]
    assert g["pcie"] == [5, 5, 5, 16, 16, 0]
    assert g["nvlink"] == [SUCCESS, INVALID_ARGUMENT]
    assert g["temp"] == [34, 34, 92, 89, 95, 87]
    assert g["power"] == [71000, 700000, 700000, 700000]
    assert g["persistence"] == 1
    assert g["util"] == [0, 0]
    assert g["procs"] == [0, 0]
    assert g["arch"] == 9
    assert g["cc"] == [9, 0]
    assert g["pstate"] == 0
    assert g["clocks"] == [1980, 1980, 2619]
    assert g["events"] == 0x1F
    assert g["fields"]["12345"] == [NOT_SUPPORTED, 0]
    assert g["field_values"] == {
        "91": 18,
        "38": 0,
        "94": 0,
        "95": 0,
        "142": 0,
        "144": 0,
        "230": 0,
        "74": 0,
        "270": 0,
    }
    assert g["fields"]["91"] == [SUCCESS, 1]  # unsigned int
    assert g["fields"]["38"] == [SUCCESS, 3]  # unsigned long long
    # A GPU without NVLink.
    assert healthy["gpus"][1]["nvlink"] == [NOT_SUPPORTED, NOT_SUPPORTED]
    assert healthy["gpus"][1]["fields"]["38"][0] == NOT_SUPPORTED


def test_in_process_load(fake: Fake) -> None:
    out, _ = fake.run(
        gpu(),
        f"""
        ctypes.CDLL({str(fake.lib_dir / LIB_NAME)!r}, mode=ctypes.RTLD_GLOBAL)
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["busId"] = n.nvmlDeviceGetPciInfo(h).busId
        """,
        in_process=True,
    )
    assert out["busId"] == "00000000:18:00.0"


# ---- faults --------------------------------------------------------------------------------


def test_ecc_counters_grow(fake: Fake) -> None:
    ecc = {
        "volatile_corrected": 7,
        "volatile_uncorrected": {"base": 2, "per_s": 0},
        "aggregate_corrected": {"base": 100, "per_s": 1000},
        "aggregate_uncorrected": 8.5e10,
    }
    out, _ = fake.run(
        gpu(ecc=ecc, ecc_mode=[1, 0]),
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["first"] = [n.nvmlDeviceGetTotalEccErrors(h, e, c) for c in (0, 1) for e in (0, 1)]
        time.sleep(0.05)
        out["later"] = n.nvmlDeviceGetTotalEccErrors(h, 0, 1)
        out["mode"] = n.nvmlDeviceGetEccMode(h)
        out["bad_type"] = rc(n.nvmlDeviceGetTotalEccErrors, h, 2, 0)
        """,
    )
    vc, vu, ac, au = out["first"]
    assert [vc, vu, au] == [7, 2, 85_000_000_000]
    assert 100 <= ac < 100 + 1000 * 5
    assert out["later"] >= 150  # at least 0.05 s at 1000/s
    assert out["mode"] == [1, 0]
    assert out["bad_type"] == INVALID_ARGUMENT


def test_remapped_rows(fake: Fake) -> None:
    rows = {"correctable": 3, "uncorrectable": 1, "pending": True, "failure": True}
    out, _ = fake.run(
        gpu(remapped_rows=rows),
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["rows"] = n.nvmlDeviceGetRemappedRows(h)
        out["fields"] = [f.value.uiVal for f in n.nvmlDeviceGetFieldValues(h, [142, 143, 144, 145])]
        """,
    )
    assert out["rows"] == [3, 1, 1, 1]
    assert out["fields"] == [3, 1, 1, 1]


def test_retired_pages(fake: Fake) -> None:
    out, _ = fake.run(
        gpu(retired_pages={"single_bit": 3, "double_bit": 1, "pending": True}),
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["sbe"] = len(n.nvmlDeviceGetRetiredPages(h, 0))
        out["dbe"] = len(n.nvmlDeviceGetRetiredPages_v2(h, 1))
        out["pending"] = n.nvmlDeviceGetRetiredPagesPendingStatus(h)
        # The count protocol, with a buffer that is too small.
        fn = n._nvmlGetFunctionPointer("nvmlDeviceGetRetiredPages")
        count = ctypes.c_uint(1)
        pages = (ctypes.c_ulonglong * 1)()
        out["small"] = [fn(h, 0, ctypes.byref(count), pages), count.value]
        """,
    )
    assert [out["sbe"], out["dbe"], out["pending"]] == [3, 1, 1]
    assert out["small"] == [INSUFFICIENT_SIZE, 3]


def test_throttling(fake: Fake) -> None:
    throttle = {
        "sw_power_cap": 1000,
        "sync_boost": 2000,
        "sw_thermal": {"base": 0, "per_s": 1e9},
        "hw_thermal": 4000,
        "hw_power_brake": 5000,
    }
    out, _ = fake.run(
        gpu(throttle_ns=throttle, clocks_event_reasons=0x20 | 0x40),
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        time.sleep(0.02)
        fields = n.nvmlDeviceGetFieldValues(h, [74, 76, 269, 270, 271])
        out["fields"] = [f.value.ullVal for f in fields]
        out["types"] = [f.valueType for f in fields]
        out["violation"] = [n.nvmlDeviceGetViolationStatus(h, p).violationTime for p in (0, 2)]
        out["thermal"] = n.nvmlDeviceGetViolationStatus(h, 1).violationTime
        out["reasons"] = n.nvmlDeviceGetCurrentClocksEventReasons(h)
        """,
    )
    assert out["fields"][:2] == [1000, 2000]
    assert out["fields"][2] >= 20_000_000  # 0.02 s at 1e9 ns/s
    assert out["fields"][3:] == [4000, 5000]
    assert out["types"] == [3] * 5
    assert out["violation"] == [1000, 2000]
    assert out["thermal"] >= 20_000_000
    assert out["reasons"] == 0x60


def test_pcie_degraded(fake: Fake) -> None:
    out, _ = fake.run(
        gpu(pcie={"gen": 3, "width": 8}, pcie_replay={"base": 10, "per_s": 0}),
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["pcie"] = [n.nvmlDeviceGetCurrPcieLinkGeneration(h),
                       n.nvmlDeviceGetCurrPcieLinkWidth(h),
                       n.nvmlDeviceGetMaxPcieLinkGeneration(h),
                       n.nvmlDeviceGetMaxPcieLinkWidth(h)]
        out["replay"] = [n.nvmlDeviceGetPcieReplayCounter(h),
                         n.nvmlDeviceGetFieldValues(h, [94])[0].value.ullVal]
        """,
    )
    assert out["pcie"] == [3, 8, 5, 16]
    assert out["replay"] == [10, 10]


def test_nvlink_faults(fake: Fake) -> None:
    nvlink = {"links": 4, "down": [2], "crc_flit": 10, "replay": 7, "ecc_data": 1}
    out, _ = fake.run(
        gpu(nvlink=nvlink),
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["state"] = [n.nvmlDeviceGetNvLinkState(h, link) for link in range(4)]
        out["beyond"] = rc(n.nvmlDeviceGetNvLinkState, h, 4)
        fields = n.nvmlDeviceGetFieldValues(h, [38, 45, 52, 59, 160])
        out["fields"] = [f.value.ullVal for f in fields]
        out["count"] = n.nvmlDeviceGetFieldValues(h, [91])[0].value.uiVal
        out["per_link"] = [n.nvmlDeviceGetNvLinkErrorCounter(h, link, 2) for link in range(4)]
        """,
    )
    assert out["state"] == [1, 1, 0, 1]
    assert out["beyond"] == INVALID_ARGUMENT
    assert out["fields"] == [10, 0, 7, 0, 1]
    assert out["count"] == 4
    assert out["per_link"] == [3, 3, 2, 2]


# What nvmlDeviceGetGpuFabricInfo and ...V write, read through pynvml's own structs
# (handed by reference: pynvml passes the struct on as given).
FABRIC_BODY = """
n.nvmlInit()
def info(h):
    plain = n.c_nvmlGpuFabricInfo_t()
    n.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(plain))
    v2 = n.c_nvmlGpuFabricInfoV_t()
    n.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v2))
    v3 = n.c_nvmlGpuFabricInfo_v3_t()
    v3.healthSummary = 77
    n.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v3))
    return {
        "plain": [plain.state, plain.status, plain.cliqueId, bytes(plain.clusterUuid).hex()],
        "v2": [v2.version, v2.state, v2.status, v2.cliqueId, bytes(v2.clusterUuid).hex(),
               v2.healthMask],
        "v3": [v3.state, v3.healthMask, v3.healthSummary],
    }
out["gpus"] = [info(n.nvmlDeviceGetHandleByIndex(i)) for i in range(n.nvmlDeviceGetCount())]
"""


def test_fabric_info_defaults_follow_nvlink(fake: Fake) -> None:
    """A GPU with NVLinks (the default H100 SXM) reports its registration completed with
    success; one without NVLink reports the state NOT_SUPPORTED."""
    scenario = {
        "gpus": [{"bus_id": "0000:18:00.0"}, {"bus_id": "0000:19:00.0", "nvlink": {"links": 0}}]
    }
    out, _ = fake.run(scenario, FABRIC_BODY)
    zero = "00" * 16
    completed, pcie = out["gpus"]
    assert completed["plain"] == [3, SUCCESS, 0, zero]
    assert completed["v2"] == [0x02000024, 3, SUCCESS, 0, zero, 0]
    assert completed["v3"] == [3, 0, 0]
    assert pcie["plain"] == [0, SUCCESS, 0, zero]


def test_nodecheck_reads_the_fabric_without_the_bindings_own_structs(fake: Fake) -> None:
    """nodecheck's own nvml.h structs, through the binding's loader: a binding whose fabric
    classes differ (nvidia-ml-py 12.535's has no versioned call and no cliqueId) reads the
    same."""
    scenario = {
        "gpus": [
            {"bus_id": "0000:18:00.0", "fabric": {"state": "COMPLETED", "clique_id": 7}},
            {"bus_id": "0000:19:00.0", "fabric": {"state": "IN_PROGRESS", "health_mask": 5}},
        ]
    }
    body = """
    from nodecheck.checks.node.gpu import _fabric
    for name in ("c_nvmlGpuFabricInfoV_t", "nvmlDeviceGetGpuFabricInfoV",
                 "c_nvmlGpuFabricInfo_t", "nvmlDeviceGetGpuFabricInfo"):
        if hasattr(n, name):
            delattr(n, name)
    n.nvmlInit()
    read = [_fabric(n, n.nvmlDeviceGetHandleByIndex(i)) for i in range(2)]
    out["gpus"] = [[f.state, f.status, f.clique_id, f.health_mask] for f in read]
    """
    out, _ = fake.run(scenario, body)
    assert out["gpus"] == [[3, SUCCESS, 7, 0], [2, SUCCESS, 0, 5]]


def test_fabric_info_as_the_scenario_says(fake: Fake) -> None:
    fabric = {
        "state": "COMPLETED",
        "status": "NOT_READY",
        "clique_id": 4026,
        "cluster_uuid": "9c6f5af3-53bf-49b5-a436-b66766c413c3",
        "health_mask": 0x1A,
        "health_summary": 2,
    }
    scenario = {
        "gpus": [
            {"bus_id": "0000:18:00.0", "fabric": fabric},
            {"bus_id": "0000:19:00.0", "fabric": {"state": "IN_PROGRESS"}},
            {"bus_id": "0000:1a:00.0", "fabric": {"state": "NOT_STARTED"}},
        ]
    }
    out, _ = fake.run(scenario, FABRIC_BODY)
    failed, in_progress, not_started = out["gpus"]
    uuid = "9c6f5af353bf49b5a436b66766c413c3"
    assert failed["plain"] == [3, 27, 4026, uuid]  # NVML_ERROR_NOT_READY
    assert failed["v2"][1:] == [3, 27, 4026, uuid, 0x1A]
    assert failed["v3"] == [3, 0x1A, 2]
    assert in_progress["plain"][0] == 2 and not_started["plain"][0] == 1


def test_fabric_info_checks_its_version_and_arguments(fake: Fake) -> None:
    out, _ = fake.run(
        gpu(errors={"nvmlDeviceGetGpuFabricInfoV": "NOT_SUPPORTED"}),
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        versioned = n.c_nvmlGpuFabricInfoV_t()
        out["versioned"] = rc(n.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(versioned))
        out["null"] = rc(n.nvmlDeviceGetGpuFabricInfo, h, None)
        plain = n.c_nvmlGpuFabricInfo_t()
        out["plain"] = rc(n.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(plain))
        """,
    )
    assert out == {"versioned": NOT_SUPPORTED, "null": INVALID_ARGUMENT, "plain": SUCCESS}
    out, _ = fake.run(
        gpu(),
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        wrong = n.c_nvmlGpuFabricInfoV_t()
        wrong.version = n.nvmlGpuFabricInfo_v2 + 1
        out["wrong"] = rc(n.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(wrong))
        out["state"] = wrong.state
        """,
    )
    assert out == {"wrong": ARGUMENT_VERSION_MISMATCH, "state": 0}


def test_thermal_power_and_misc(fake: Fake) -> None:
    keys = {
        "temperature": 91,
        "temperature_thresholds": {"slowdown": 85},
        "power_mw": 650000,
        "power_limit_mw": 500000,
        "persistence_mode": False,
        "recovery_action": 2,
        "utilization": {"gpu": 100, "memory": 40},
        "processes": [{"pid": 4242, "used_memory": 1073741824}, {"pid": 7, "used_memory": 0}],
        "pstate": 2,
    }
    out, _ = fake.run(
        gpu(**keys),
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["temp"] = [n.nvmlDeviceGetTemperatureV(h, 0),
                       n.nvmlDeviceGetTemperatureThreshold(h, 1)]
        out["power"] = [n.nvmlDeviceGetPowerUsage(h), n.nvmlDeviceGetEnforcedPowerLimit(h)]
        out["persistence"] = n.nvmlDeviceGetPersistenceMode(h)
        out["recovery"] = n.nvmlDeviceGetFieldValues(h, [230])[0].value.uiVal
        u = n.nvmlDeviceGetUtilizationRates(h)
        out["util"] = [u.gpu, u.memory]
        out["procs"] = [[p.pid, p.usedGpuMemory, p.gpuInstanceId]
                        for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
        out["pstate"] = n.nvmlDeviceGetPerformanceState(h)
        """,
    )
    assert out["temp"] == [91, 85]
    assert out["power"] == [650000, 500000]
    assert out["persistence"] == 0
    assert out["recovery"] == 2
    assert out["util"] == [100, 40]
    assert out["procs"] == [[4242, 1073741824, 0xFFFFFFFF], [7, 0, 0xFFFFFFFF]]
    assert out["pstate"] == 2


def test_injected_errors_and_unsupported_fields(fake: Fake) -> None:
    errors = {
        "nvmlDeviceGetRetiredPages": "NOT_SUPPORTED",
        "nvmlDeviceGetPowerUsage": "NO_PERMISSION",
    }
    scenario = {
        "gpus": [
            {
                "bus_id": "0000:18:00.0",
                "errors": errors,
                "unsupported_fields": [94, 230],
                "field_errors": {"270": "NO_PERMISSION"},
            },
            {"bus_id": "0000:19:00.0"},
        ]
    }
    out, _ = fake.run(
        scenario,
        """
        n.nvmlInit()
        h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
        out["h0"] = [rc(n.nvmlDeviceGetRetiredPages, h0, 0), rc(n.nvmlDeviceGetPowerUsage, h0),
                     rc(n.nvmlDeviceGetTemperatureV, h0, 0)]
        out["h1"] = [rc(n.nvmlDeviceGetRetiredPages, h1, 0), rc(n.nvmlDeviceGetPowerUsage, h1)]
        out["fields"] = [
            f.nvmlReturn for f in n.nvmlDeviceGetFieldValues(h0, [94, 95, 230, 270, 271])
        ]
        """,
    )
    assert out["h0"] == [NOT_SUPPORTED, NO_PERMISSION, SUCCESS]
    assert out["h1"] == [SUCCESS, SUCCESS]
    assert out["fields"] == [NOT_SUPPORTED, SUCCESS, NOT_SUPPORTED, NO_PERMISSION, SUCCESS]


def test_processes_come_and_go(fake: Fake) -> None:
    scenario = {
        "gpus": [
            {
                "bus_id": "0000:18:00.0",
                "processes": [
                    {"pid": 10, "used_memory": 1, "until_s": 0.2},
                    {"pid": 11, "used_memory": 2, "after_s": 0.2},
                ],
            }
        ]
    }
    out, _ = fake.run(
        scenario,
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["before"] = [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
        time.sleep(0.25)
        out["after"] = [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
        """,
    )
    assert out == {"before": [10], "after": [11]}


def test_lost_after(fake: Fake) -> None:
    scenario = {
        "gpus": [{"bus_id": "0000:18:00.0", "lost_after_s": 0.2}, {"bus_id": "0000:19:00.0"}]
    }
    out, _ = fake.run(
        scenario,
        """
        n.nvmlInit()
        h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
        out["before"] = rc(n.nvmlDeviceGetName, h0)
        time.sleep(0.25)
        out["after"] = [rc(n.nvmlDeviceGetName, h0), rc(n.nvmlDeviceGetFieldValues, h0, [94]),
                        rc(n.nvmlDeviceGetHandleByIndex, 0), rc(n.nvmlDeviceGetName, h1)]
        out["count"] = n.nvmlDeviceGetCount()
        """,
    )
    assert out["before"] == SUCCESS
    assert out["after"] == [GPU_IS_LOST, GPU_IS_LOST, GPU_IS_LOST, SUCCESS]
    assert out["count"] == 2


def test_hang_released_by_reinit_with_another_scenario(fake: Fake) -> None:
    hanging = {
        "hang_s": 20,
        "gpus": [{"bus_id": "0000:18:00.0", "hang": {"nvmlDeviceGetPowerUsage": 0}}],
    }
    healthy = fake.scenario(gpu(power_mw=123000))
    out, _ = fake.run(
        hanging,
        f"""
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        results = []
        def call():
            start = time.monotonic()
            results.append([rc(n.nvmlDeviceGetPowerUsage, h), time.monotonic() - start])
        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        out["hung"] = len(results)
        out["others_answer"] = [n.nvmlDeviceGetName(h), n.nvmlDeviceGetCount()]
        os.environ["FAKE_NVML_SCENARIO"] = {str(healthy)!r}
        n.nvmlInit()
        for t in threads:
            t.join(5)
        out["results"] = results
        out["power"] = n.nvmlDeviceGetPowerUsage(h)
        """,
    )
    assert out["hung"] == 0
    assert out["others_answer"] == ["NVIDIA H100 80GB HBM3", 1]
    assert [r[0] for r in out["results"]] == [UNKNOWN] * 3
    assert all(0.15 < r[1] < 2 for r in out["results"])
    assert out["power"] == 123000


def test_concurrent_calls_during_reloads(fake: Fake) -> None:
    first = fake.scenario({"gpus": [{"bus_id": f"0000:{b:02x}:00.0"} for b in range(8)]})
    second = fake.scenario({"gpus": [{"bus_id": f"0000:{b:02x}:00.0"} for b in range(4)]})
    out, _ = fake.run(
        first,
        f"""
        n.nvmlInit()
        handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
        codes = set()
        def worker(k):
            for i in range(300):
                h = handles[(i + k) % 8]
                codes.add(rc(n.nvmlDeviceGetTemperatureV, h, 0))
                codes.add(rc(n.nvmlDeviceGetFieldValues, h, [38, 94]))
                codes.add(rc(n.nvmlDeviceGetHandleByIndex, i % 8))
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for i in range(20):
            os.environ["FAKE_NVML_SCENARIO"] = [{str(first)!r}, {str(second)!r}][i % 2]
            n.nvmlInit()
            n.nvmlShutdown()
        for t in threads:
            t.join(10)
        out["alive"] = sum(t.is_alive() for t in threads)
        out["codes"] = sorted(codes)
        """,
    )
    assert out["alive"] == 0
    # Handles of GPUs 4-7 are invalid while the 4-GPU scenario is loaded.
    assert set(out["codes"]) <= {SUCCESS, INVALID_ARGUMENT}


def test_hang_times_out_and_global_hang(fake: Fake) -> None:
    scenario = {
        "hang_s": 0.2,
        "hang": {"nvmlDeviceGetCount_v2": 0.1},
        "gpus": [{"bus_id": "0000:18:00.0", "hang": {"nvmlDeviceGetTemperatureV": 0}}],
    }
    out, _ = fake.run(
        scenario,
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["count_early"] = n.nvmlDeviceGetCount()
        start = time.monotonic()
        out["temp"] = [rc(n.nvmlDeviceGetTemperatureV, h, 0), time.monotonic() - start]
        start = time.monotonic()
        out["count_late"] = [rc(n.nvmlDeviceGetCount), time.monotonic() - start]
        """,
    )
    assert out["count_early"] == 1
    assert out["temp"][0] == UNKNOWN and 0.2 <= out["temp"][1] < 1.5
    assert out["count_late"][0] == UNKNOWN and 0.2 <= out["count_late"][1] < 1.5


def test_global_errors(fake: Fake) -> None:
    scenario = {
        "errors": {
            "nvmlDeviceGetCount_v2": "UNKNOWN",
            "nvmlSystemGetDriverVersion": "NO_PERMISSION",
        },
        "gpus": [{"bus_id": "0000:18:00.0"}],
    }
    out, _ = fake.run(
        scenario,
        """
        n.nvmlInit()
        out["codes"] = [rc(n.nvmlDeviceGetCount), rc(n.nvmlSystemGetDriverVersion),
                        rc(n.nvmlSystemGetCudaDriverVersion)]
        """,
    )
    assert out["codes"] == [UNKNOWN, NO_PERMISSION, SUCCESS]


def test_reload_on_changed_file_and_refcount(fake: Fake) -> None:
    path = fake.scenario(gpu(temperature=40))
    out, _ = fake.run(
        path,
        f"""
        path = {str(path)!r}
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["first"] = n.nvmlDeviceGetTemperatureV(h, 0)
        with open(path, "w") as f:
            f.write({json.dumps(gpu(temperature=88))!r})
        os.utime(path, ns=(0, 10**18))  # a surely different mtime
        out["before_reinit"] = n.nvmlDeviceGetTemperatureV(h, 0)
        n.nvmlInit()  # refcount 2
        out["after_reinit"] = n.nvmlDeviceGetTemperatureV(h, 0)
        n.nvmlShutdown()  # refcount 1
        out["still"] = rc(n.nvmlDeviceGetTemperatureV, h, 0)
        n.nvmlShutdown()  # refcount 0
        out["gone"] = rc(n.nvmlDeviceGetTemperatureV, h, 0)
        out["extra_shutdown"] = rc(n.nvmlShutdown)
        """,
    )
    assert [out["first"], out["before_reinit"], out["after_reinit"]] == [40, 40, 88]
    assert [out["still"], out["gone"], out["extra_shutdown"]] == [0, UNINITIALIZED, UNINITIALIZED]


# ---- events --------------------------------------------------------------------------------


def test_xid_event_timing(fake: Fake) -> None:
    scenario = {
        "gpus": [
            {
                "bus_id": "0000:18:00.0",
                "xids": [{"xid": 79, "after_s": 0.3}, {"xid": 13, "after_s": 0}],
            },
            {"bus_id": "0000:19:00.0", "xids": [{"xid": 48, "after_s": 0.15}]},
            {"bus_id": "0000:1a:00.0", "xids": [{"xid": 31, "after_s": 0}]},  # not registered
        ]
    }
    out, _ = fake.run(
        scenario,
        """
        n.nvmlInit()
        start = time.monotonic()
        es = n.nvmlEventSetCreate()
        for i in (0, 1):
            h = n.nvmlDeviceGetHandleByIndex(i)
            n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
        events = []
        for _ in range(3):
            d = n.nvmlEventSetWait_v2(es, 2000)
            events.append([d.eventData, n.nvmlDeviceGetIndex(d.device), d.eventType,
                           d.gpuInstanceId, time.monotonic() - start])
        out["events"] = events
        t = time.monotonic()
        out["timeout"] = [rc(n.nvmlEventSetWait_v2, es, 100), time.monotonic() - t]
        # A second set sees the same events again.
        es2 = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(1), 8, es2)
        out["second_set"] = n.nvmlEventSetWait(es2, 0).eventData
        n.nvmlEventSetFree(es2)
        out["freed"] = rc(n.nvmlEventSetFree, es2)
        out["unsupported_type"] = rc(n.nvmlDeviceRegisterEvents, n.nvmlDeviceGetHandleByIndex(2),
                                     n.nvmlEventTypePowerSourceChange, es)
        """,
    )
    xids = [e[:4] for e in out["events"]]
    assert xids == [[13, 0, 8, 0xFFFFFFFF], [48, 1, 8, 0xFFFFFFFF], [79, 0, 8, 0xFFFFFFFF]]
    times = [e[4] for e in out["events"]]
    assert times[0] < 0.15 <= times[1] < 0.3 <= times[2] < 1.0
    assert out["timeout"][0] == TIMEOUT and 0.1 <= out["timeout"][1] < 1.0
    assert out["second_set"] == 48
    assert out["freed"] == INVALID_ARGUMENT
    assert out["unsupported_type"] == NOT_SUPPORTED


def test_faults_timed_from_registration(fake: Fake) -> None:
    """ "timed_from": "registration": the GPU's XIDs and loss count from its first XID
    registration, so a GPU registered late still sees them in order; before it, the GPU
    answers (not lost, however long after load)."""
    timed = {
        "bus_id": "0000:18:00.0",
        "timed_from": "registration",
        "xids": [{"xid": 79, "after_s": 3}],
        "lost_after_s": 0.3,
    }
    scenario = {"gpus": [timed, {"bus_id": "0000:19:00.0", "xids": [{"xid": 13}]}]}
    out, _ = fake.run(
        scenario,
        """
        n.nvmlInit()
        h0 = n.nvmlDeviceGetHandleByIndex(0)
        time.sleep(0.5)  # past lost_after_s from load: still answering
        out["before"] = rc(n.nvmlDeviceGetName, h0)
        es = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(1), 8, es)
        n.nvmlDeviceRegisterEvents(h0, 8, es)
        registered = time.monotonic()
        out["first"] = [n.nvmlEventSetWait_v2(es, 0).eventData, rc(n.nvmlEventSetWait_v2, es, 0)]
        d = n.nvmlEventSetWait_v2(es, 10000)
        out["xid"] = [d.eventData, time.monotonic() - registered]
        out["after"] = rc(n.nvmlDeviceGetName, h0)
        """,
    )
    assert out["before"] == SUCCESS
    assert out["first"] == [13, TIMEOUT]  # GPU 0's XID 79 is 3 s after its registration
    assert out["xid"][0] == 79 and 2.9 <= out["xid"][1] < 10
    assert out["after"] == GPU_IS_LOST


def test_event_set_sees_reloaded_scenario(fake: Fake) -> None:
    second = fake.scenario(gpu(xids=[{"xid": 94, "after_s": 0}]))
    out, _ = fake.run(
        gpu(xids=[{"xid": 63, "after_s": 0}]),
        f"""
        n.nvmlInit()
        es = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(0), 8, es)
        out["first"] = [n.nvmlEventSetWait(es, 100).eventData, rc(n.nvmlEventSetWait, es, 0)]
        os.environ["FAKE_NVML_SCENARIO"] = {str(second)!r}
        n.nvmlInit()
        out["second"] = [n.nvmlEventSetWait(es, 100).eventData, rc(n.nvmlEventSetWait, es, 0)]
        """,
    )
    assert out["first"] == [63, TIMEOUT]
    assert out["second"] == [94, TIMEOUT]


# ---- init ----------------------------------------------------------------------------------


def test_init_error(fake: Fake) -> None:
    out, _ = fake.run(
        {"init_error": "LIB_RM_VERSION_MISMATCH", "gpus": [{"bus_id": "0000:18:00.0"}]},
        """
        out["init"] = rc(n.nvmlInit)
        out["message"] = n.nvmlErrorString(out["init"])
        out["count"] = rc(n.nvmlDeviceGetCount)
        """,
    )
    assert out["init"] == LIB_RM_VERSION_MISMATCH
    assert out["message"] == "RM has detected an NVML/RM version mismatch."
    assert out["count"] == UNINITIALIZED


def test_init_hang(fake: Fake) -> None:
    out, _ = fake.run(
        {"init_hang_s": 0.2},
        """
        start = time.monotonic()
        n.nvmlInit()
        out["took"] = time.monotonic() - start
        out["count"] = n.nvmlDeviceGetCount()
        """,
    )
    assert out["took"] >= 0.2
    assert out["count"] == 0


def test_missing_env_var_or_file(fake: Fake) -> None:
    out, _ = fake.run(None, 'out["init"] = rc(n.nvmlInit)')
    assert out["init"] == DRIVER_NOT_LOADED
    out, stderr = fake.run(fake.tmp_path / "absent.json", 'out["init"] = rc(n.nvmlInit)')
    assert out["init"] == DRIVER_NOT_LOADED
    assert "absent.json: no such scenario file" in stderr


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ('{"gpus": [{"bus_id": "0000:18:00.0", "nmae": "x"}]}', "unknown key 'nmae' at byte 37"),
        ('{"gpus": [}', "unexpected character at byte 10"),
        ('{"gpus": []', "expected ',' or '}' at byte 11"),
        ('{"driver_version": "\\q"}', "bad escape in string at byte 20"),
        ('{"gpus": [{"bus_id": "0000:18:00.0"}]} x', "trailing characters"),
        ('{"gpus": [{}]}', "a GPU needs a 'bus_id' at byte 10"),
        ('{"gpus": [{"bus_id": "18:00.0"}]}', "'bus_id' must look like"),
        ('{"init_hang_s": "1"}', "'init_hang_s' must be a number"),
        ('{"init_error": "NO_SUCH_CODE"}', "unknown error name 'NO_SUCH_CODE'"),
        (
            json.dumps(gpu(errors={"nvmlDeviceGetPowerUsag": "UNKNOWN"})),
            "'nvmlDeviceGetPowerUsag' is not a per-device function",
        ),
        ('{"hang": {"nvmlDeviceGetName": 0}}', "is not a system/global function"),
        ('{"a": 1, "a": 2}', "duplicate key 'a' at byte 9"),
        (json.dumps(gpu(timed_from="boot")), '\'timed_from\' is "load" or "registration"'),
        (json.dumps(gpu(fabric={"state": "DONE"})), "'state' is NOT_SUPPORTED, NOT_STARTED"),
        (json.dumps(gpu(fabric={"status": "FINE"})), "unknown error name 'FINE'"),
        (json.dumps(gpu(fabric={"cluster_uuid": "9c6f"})), "'cluster_uuid' must be 32 hex"),
        (json.dumps(gpu(fabric={"clique": 1})), "unknown key 'clique'"),
    ],
)
def test_scenario_errors(fake: Fake, doc: str, message: str) -> None:
    path = fake.scenario(doc)
    out, stderr = fake.run(path, 'out["init"] = rc(n.nvmlInit)')
    assert out["init"] == UNKNOWN
    line = stderr.strip()
    assert line.startswith(f"fake-nvml: {path}: "), line
    assert message in line, line
    assert re.search(r" at byte \d+$", line), line


def test_scenario_syntax(fake: Fake) -> None:
    doc = (
        '{"description": "esc \\" \\\\ \\n \\u0041 / \\/",\n'
        ' "driver_version": "550.1\\u0030", "cuda_driver_version": 1.2e4,\n'
        ' "gpus": [{"bus_id": "0000:18:00.0", "memory_total": 8.5e10, "memory_used": 0,\n'
        '           "lost_after_s": null, "visible": true, "name": "A\\tB"}]}'
    )
    out, _ = fake.run(
        doc,
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["driver"] = n.nvmlSystemGetDriverVersion()
        out["cuda"] = n.nvmlSystemGetCudaDriverVersion()
        out["mem"] = n.nvmlDeviceGetMemoryInfo(h).total
        out["name"] = n.nvmlDeviceGetName(h)
        """,
    )
    assert out == {"driver": "550.10", "cuda": 12000, "mem": 85_000_000_000, "name": "A\tB"}


def test_readme_examples_load(fake: Fake) -> None:
    readme = (Path(__file__).parent / "README.md").read_text()
    docs: list[dict[str, Any]] = []
    for text in re.findall(r"```json\n(.*?)```", readme, re.S) + re.findall(r"`(\{.*?\})`", readme):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            continue  # a schema sketch such as {"gen", "max_gen"}, not an example
        if "bus_id" in doc:
            doc = {"gpus": [doc]}
        if "init_hang_s" in doc:
            doc["init_hang_s"] = 0.01
        docs.append(doc)
    assert len(docs) >= 20
    paths = [str(fake.scenario(doc)) for doc in docs]
    out, stderr = fake.run(
        None,
        f"""
        codes = []
        for path in {paths!r}:
            os.environ["FAKE_NVML_SCENARIO"] = path
            codes.append(rc(n.nvmlInit))
            if codes[-1] == 0:
                n.nvmlShutdown()
        out["codes"] = codes
        """,
    )
    expected = [LIB_RM_VERSION_MISMATCH if "init_error" in d else SUCCESS for d in docs]
    assert out["codes"] == expected, stderr


def test_every_error_name_of_the_header(fake: Fake) -> None:
    header = find_nvml_header().read_text()
    codes = dict(re.findall(r"^\s*NVML_ERROR_(\w+)\s*=\s*(\d+)", header, re.M))
    assert len(codes) >= 30
    paths = {name: str(fake.scenario({"init_error": name})) for name in codes}
    out, _ = fake.run(
        None,
        f"""
        for name, path in {paths!r}.items():
            os.environ["FAKE_NVML_SCENARIO"] = path
            code = rc(n.nvmlInit)
            out[name] = [code, n.nvmlErrorString(code)]
        """,
    )
    assert {name: value[0] for name, value in out.items()} == {
        name: int(value) for name, value in codes.items()
    }
    messages = [value[1] for name, value in out.items() if name != "UNKNOWN"]
    assert "Unknown Error" not in messages
    assert len(set(messages)) == len(messages)


def test_hang_window_answers_again_after_until_s(fake: Fake) -> None:
    """A hang with until_s: a call made in the window blocks until until_s (then UNKNOWN),
    calls after it answer; before after_s, calls answer too."""
    scenario = {
        "gpus": [
            {
                "bus_id": "0000:18:00.0",
                "hang": {"nvmlDeviceGetPowerUsage": {"after_s": 1.0, "until_s": 4.0}},
            }
        ],
        "hang": {"nvmlSystemGetDriverVersion": {"until_s": 0.3}},
    }
    out, _ = fake.run(
        scenario,
        """
        n.nvmlInit()
        loaded = time.monotonic()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["before"] = n.nvmlDeviceGetPowerUsage(h)
        start = time.monotonic()
        out["global"] = [rc(n.nvmlSystemGetDriverVersion), time.monotonic() - start]
        while time.monotonic() - loaded < 1.05:
            time.sleep(0.01)
        start = time.monotonic()
        out["during"] = [rc(n.nvmlDeviceGetPowerUsage, h), time.monotonic() - start]
        out["after"] = n.nvmlDeviceGetPowerUsage(h)
        out["global_after"] = n.nvmlSystemGetDriverVersion()
        """,
    )
    assert out["before"] == 71000 and out["after"] == 71000
    assert out["global"][0] == UNKNOWN and out["global"][1] < 1.5
    assert out["during"][0] == UNKNOWN and 0.5 < out["during"][1] < 4.5
    assert out["global_after"] == "570.124.06"


def test_nonsense_answers(fake: Fake) -> None:
    """device_count, bus_id_reported, temperatures beyond an int, PCIe values up to 255 and
    \\u0080-\\u00ff escapes (single bytes, not UTF-8) are answered as written."""
    scenario = {
        "device_count": 100000,
        "gpus": [
            {
                "bus_id": "0000:18:00.0",
                "bus_id_reported": "garbage",
                "name": "H100\u0080\u00ff",
                "temperature": 4294967295,
                "pcie": {"width": 255, "gen": 99},
            }
        ],
    }
    out, _ = fake.run(
        scenario,
        """
        n.nvmlInit()
        out["count"] = n.nvmlDeviceGetCount()
        h = n.nvmlDeviceGetHandleByIndex(0)
        out["bus"] = n.nvmlDeviceGetPciInfo(h).busId
        buf = ctypes.create_string_buffer(96)
        n._nvmlGetFunctionPointer("nvmlDeviceGetName")(h, buf, ctypes.c_uint(96))
        out["name"] = list(buf.value)
        out["temp_v"] = n.nvmlDeviceGetTemperatureV(h, 0)
        out["temp_old"] = n.nvmlDeviceGetTemperature(h, 0)
        out["pcie"] = [n.nvmlDeviceGetCurrPcieLinkWidth(h),
                       n.nvmlDeviceGetCurrPcieLinkGeneration(h)]
        """,
    )
    assert out["count"] == 100000
    assert out["bus"] == "garbage"
    assert out["name"] == [*b"H100", 0x80, 0xFF]
    assert out["temp_v"] == -1 and out["temp_old"] == 4294967295
    assert out["pcie"] == [255, 99]
