"""GPUs whose memory the nvidia driver attaches to the CPU coherently: on Grace Hopper
(GH200) and Grace Blackwell (GB200) the GPU hangs off its Grace CPU by NVLink-C2C.

The driver creates `/proc/driver/nvidia/gpus/<bus id>/numa_status` only for a GPU whose
NUMA status is not "disabled", that is whose memory is coherent with the CPU's and can be
onlined as a NUMA node of its own (NVIDIA/open-gpu-kernel-modules,
kernel-open/nvidia/nv-procfs.c: nv_procfs_add_gpu creates it when
`nv_get_numa_status(nvl) != NV_IOCTL_NUMA_STATUS_DISABLED`; it prints "Node: N" and
"Status: online|offline|..."). A PCIe GPU, even in a Grace server's slot, has none. (The
only other platform with such a file, POWER9 with NVLink to the CPU, is no longer made.)
"""

from __future__ import annotations

import re

from nodecheck.checks.node.fs import NodeFS, ReadError, read_optional_text
from nodecheck.checks.node.gpu import driver_gpu_folders
from nodecheck.checks.record import record


@record
class CoherentGpu:
    bdf: str
    memory_node: int | None  # the NUMA node of its memory ("Node: N"); None: not said
    status: str  # "online", "offline", ... as printed; "" when unreadable
    problem: str = ""  # why numa_status could not be read (it exists: the GPU is coherent)


def parse_numa_status(text: str) -> tuple[int | None, str]:
    """("Node:      2\\nStatus:    online\\n...") -> (2, "online"); a node below 0 (the
    driver prints -1 before the memory is onlined) is None."""
    node = re.search(r"^Node:\s*(-?\d+)\s*$", text, re.MULTILINE)
    status = re.search(r"^Status:\s*(\S.*?)\s*$", text, re.MULTILINE)
    number = int(node.group(1)) if node else None
    return (number if number is not None and number >= 0 else None), (
        status.group(1) if status else ""
    )


def read_coherent_gpus(fs: NodeFS) -> CoherentGpus:
    """The GPUs of /proc/driver/nvidia/gpus with a numa_status file, by bus id. None
    without the driver's folder (no driver, or a container without it); a folder that
    cannot be listed is `problem`, never "no coherent GPU"."""
    path = fs.proc("driver", "nvidia", "gpus")
    try:
        folders = driver_gpu_folders(fs)
    except ReadError as err:
        return CoherentGpus({}, str(err))
    found = {}
    for bdf, name in folders.items():
        try:
            text = read_optional_text(path / name / "numa_status")
        except ReadError as err:
            found[bdf] = CoherentGpu(bdf, None, "", str(err))
            continue
        if text is not None:
            found[bdf] = CoherentGpu(bdf, *parse_numa_status(text))
    return CoherentGpus(found)


@record
class CoherentGpus:
    """The coherent GPUs (read_coherent_gpus) by bus id: the coherent_gpus part; `problem`
    says why the driver's GPU folder could not be listed."""

    by_bus_id: dict[str, CoherentGpu]
    problem: str | None = None
