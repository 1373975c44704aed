"""What the loaded nvidia kernel module says of itself in /proc/driver/nvidia: its version
(`version`) and the GPUs it exposes here (`gpus/<bus id>`), each with why it could not be
read. The files are the driver's (NVIDIA/open-gpu-kernel-modules,
kernel-open/nvidia/nv-procfs.c); the parsing is in node/gpu.py.
"""

from __future__ import annotations

from nodecheck.checks.node.fs import NodeFS, ReadError
from nodecheck.checks.node.gpu import read_driver_gpus, read_kernel_module_version
from nodecheck.checks.record import record


@record
class NvidiaDriver:
    """`module_version` None with no `module_error`: no /proc/driver/nvidia/version (no
    driver, or a container without it). `exposed_gpus` None with no `gpus_error`: no
    /proc/driver/nvidia/gpus folder (no driver loaded)."""

    module_version: str | None
    exposed_gpus: frozenset[str] | None
    module_error: str = ""
    gpus_error: str = ""


def read_nvidia_driver(fs: NodeFS) -> NvidiaDriver:
    module_error = gpus_error = ""
    try:
        module: str | None = read_kernel_module_version(fs)
    except ReadError as err:
        module, module_error = None, str(err)
    try:
        exposed = read_driver_gpus(fs)
    except ReadError as err:
        exposed, gpus_error = None, str(err)
    return NvidiaDriver(
        module, None if exposed is None else frozenset(exposed), module_error, gpus_error
    )
