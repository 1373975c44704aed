"""rdma_ports on hwloc's real captures that have RDMA devices (a QLogic TrueScale qib0 on
PCI class 0x0c0600, a ConnectX-3 mlx4_0 on 0x028000, a Xeon Phi's SCIF device whose link
the capture left dangling): every RDMA device gets a result, each port's state and
counters are the files' own, and nothing is an unexplained error. Skips without the data;
test_rdma_ports.py covers these classes on replica trees."""

from __future__ import annotations

import os
from pathlib import Path

from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.net import PORT_ERROR_COUNTERS, parse_port_state
from nodecheck.checks.registry import load_checks
from nodecheck.checks.result import Status
from nodecheck.checks.runner import run_checks
from tests.conftest import CLEAN_ENVIRON


def test_every_rdma_device_of_the_captures_is_judged(hwloc_captures: dict[str, Path]) -> None:
    judged = 0
    for name, root in sorted(hwloc_captures.items()):
        infiniband = root / "sys" / "class" / "infiniband"
        if not infiniband.is_dir() or not os.listdir(infiniband):
            continue
        fs = NodeFS(sysfs=root / "sys", procfs=root / "proc", rootfs=root)
        context = CheckContext(fs=fs, environ=dict(CLEAN_ENVIRON), uid=1000)
        (run,) = run_checks([load_checks()["rdma_ports"]], context)
        results = {result.subject: result for result in run.results}
        for device in sorted(os.listdir(infiniband)):
            ports = infiniband / device / "ports"
            if not ports.is_dir():
                # A device the capture left as a dangling link: not on PCI, so not judged.
                assert results[f"rdma {device}"].status is Status.SKIP, (name, device)
                continue
            for port in sorted(os.listdir(ports)):
                result = results[f"rdma {device}/{port}"]
                judged += 1
                state = parse_port_state((ports / port / "state").read_text())
                assert result.details["state"] == state, (name, device, port)
                counters = result.details["counters"]
                assert isinstance(counters, dict)
                for counter in PORT_ERROR_COUNTERS:
                    path = ports / port / "counters" / counter
                    assert counters[counter] == int(path.read_text()), (name, path)
                assert result.status is (Status.OK if state == "ACTIVE" else Status.WARN), (
                    name,
                    result,
                )
                assert result.details["role"] == "unclassified"
    assert judged >= 3
