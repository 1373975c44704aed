"""How the nvidia driver names each GPU it exposes here, from its own files, without NVML:
the GPU's UUID and device minor number, and the MIG compute instances it lists.

`tune` and `exec` read this to map a `CUDA_VISIBLE_DEVICES` that names GPUs by UUID or
MIG device to the GPUs' bus ids (tuning/visible_devices.py). The driver's files answer
that without starting NVML (nvmlInit costs far more than a `tune` may spend, and
`tune` never loads NVML):

- `/proc/driver/nvidia/gpus/<bus id>/information` (NVIDIA/open-gpu-kernel-modules,
  kernel-open/nvidia/nv-procfs.c, nv_procfs_read_gpu_info) prints "GPU UUID: \\t GPU-..."
  only when the resource manager gives a UUID (rm_get_gpu_uuid non-NULL), and
  "Device Minor: \\t N" (the N of /dev/nvidiaN); when it cannot take its power
  reference (rm_ref_dynamic_power) it prints nothing at all. Inside a container,
  libnvidia-container mounts only the given GPUs' folders, as CUDA there sees only them.
- `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/ci<C>/access`: one folder per
  MIG compute instance, named by the parent GPU's device minor (NVIDIA's MIG user guide,
  "Device Nodes and Capabilities"; NVIDIA/libnvidia-container src/nvc_info.c builds
  these paths from the GPU's minor). They name no MIG device's UUID: only NVML knows
  which `MIG-<uuid>` is which instance.
"""

from __future__ import annotations

import re
from dataclasses import field

from nodecheck.checks.node.fs import NodeFS, ReadError, list_dir, read_optional_text
from nodecheck.checks.node.gpu import driver_gpu_folders
from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.record import record

_UUID_LINE = LazyPattern(r"^GPU UUID:\s*(\S+)\s*$", re.MULTILINE)
_MINOR_LINE = LazyPattern(r"^Device Minor:\s*([0-9]{1,9})\s*$", re.MULTILINE)
_GPU_INSTANCE = LazyPattern(r"gi([0-9]{1,9})")
_COMPUTE_INSTANCE = LazyPattern(r"ci([0-9]{1,9})")


def parse_gpu_information(text: str) -> tuple[str | None, int | None]:
    """(UUID, device minor) from a GPU's `information` file; None for a line the driver
    did not print."""
    uuid = _UUID_LINE.search(text)
    minor = _MINOR_LINE.search(text)
    return (uuid.group(1) if uuid else None), (int(minor.group(1)) if minor else None)


@record
class MigInstance:
    """One MIG compute instance: `MIG-GPU-<uuid>/<gpu_instance>/<compute_instance>`."""

    gpu_instance: int
    compute_instance: int


@record
class DriverGpu:
    """One GPU folder of /proc/driver/nvidia/gpus. `uuid` None: the information file
    printed no UUID line (or could not be read: `problem`). `mig_instances` None: not
    known (no device minor, or the capabilities folder could not be listed:
    `mig_problem`); () when the driver lists no MIG instance of this GPU."""

    bdf: str
    uuid: str | None
    minor: int | None
    mig_instances: tuple[MigInstance, ...] | None = ()
    problem: str = ""
    mig_problem: str = ""

    def begins_with(self, prefix: str) -> bool:
        """Whether this GPU's UUID begins with `prefix` (CUDA's abbreviated form)."""
        return self.uuid is not None and self.uuid.startswith(prefix)

    def lists(self, instance: MigInstance) -> bool:
        """Whether the driver lists this MIG compute instance of this GPU."""
        return instance in (self.mig_instances or ())

    @property
    def uuid_unknown_why(self) -> str:
        """Why this GPU's UUID is not known ("" when it is)."""
        if self.uuid is not None:
            return ""
        return self.problem or "its information file prints no GPU UUID line"


@record
class GpuIdentities:
    """The gpu_identities part: what the driver's files say of each GPU it exposes, by
    bus id (the folders' order); `problem`: why /proc/driver/nvidia/gpus could not be
    listed (then nothing is known). An absent folder (no driver) is no GPU, no problem."""

    by_bus_id: dict[str, DriverGpu] = field(default_factory=dict)
    problem: str = ""


def read_mig_instances(fs: NodeFS, minor: int) -> tuple[MigInstance, ...]:
    """The compute instances listed under capabilities/gpu<minor>/mig (none when the
    folder does not exist: MIG off, or a driver without MIG); ReadError when a folder
    cannot be listed."""
    base = fs.proc("driver", "nvidia", "capabilities", f"gpu{minor}", "mig")
    instances = []
    for gi_name in list_dir(base):
        gpu_instance = _GPU_INSTANCE.fullmatch(gi_name)
        if gpu_instance is None:
            continue
        for ci_name in list_dir(base / gi_name):
            compute_instance = _COMPUTE_INSTANCE.fullmatch(ci_name)
            if compute_instance is not None:
                instances.append(
                    MigInstance(int(gpu_instance.group(1)), int(compute_instance.group(1)))
                )
    return tuple(instances)


def read_driver_gpu(fs: NodeFS, name: str, bdf: str) -> DriverGpu:
    """One GPU folder's information file and its MIG instances, each problem recorded."""
    path = fs.proc("driver", "nvidia", "gpus", name, "information")
    try:
        text = read_optional_text(path)
    except ReadError as err:
        return DriverGpu(bdf, None, None, None, problem=str(err))
    if text is None:
        return DriverGpu(bdf, None, None, None, problem=f"{path}: no such file")
    uuid, minor = parse_gpu_information(text)
    problem = "" if text else f"{path} is empty (the driver printed nothing)"
    if minor is None:
        return DriverGpu(bdf, uuid, None, None, problem, "its device minor is not known")
    try:
        instances: tuple[MigInstance, ...] | None = read_mig_instances(fs, minor)
        mig_problem = ""
    except ReadError as err:
        instances, mig_problem = None, str(err)
    return DriverGpu(bdf, uuid, minor, instances, problem, mig_problem)


def read_gpu_identities(fs: NodeFS) -> GpuIdentities:
    try:
        folders = driver_gpu_folders(fs)
    except ReadError as err:
        return GpuIdentities({}, str(err))
    return GpuIdentities({bdf: read_driver_gpu(fs, name, bdf) for bdf, name in folders.items()})
