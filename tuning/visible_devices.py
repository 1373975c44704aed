"""CUDA_VISIBLE_DEVICES read as CUDA reads it, each entry mapped to its GPU's bus id.

CUDA's documented rules (CUDA Programming Guide, "CUDA Environment Variables",
CUDA_VISIBLE_DEVICES; NVIDIA's MIG user guide, "CUDA Device Enumeration"):

- unset: every GPU is visible; set and empty: none is;
- a comma-separated sequence of GPU identifiers, enumerated in that order: integer
  indices; GPU UUIDs as `nvidia-smi -L` prints them (`GPU-8932f937-d72c-...`), or enough
  of their beginning "to uniquely identify that GPU in the target system"; MIG devices
  as `MIG-<GPU-UUID>/<GPU instance ID>/<compute instance ID>` (drivers R450 and R460)
  or `MIG-<uuid>` (as `nvidia-smi -L` prints them since R470);
- "If an invalid index is encountered, only devices with indices that appear before the
  invalid index in the list are visible" (0,2,-1,1 shows 0 and 2);
- "With CUDA 11/R450 and CUDA 12/R525, only enumeration of a single MIG instance is
  supported": a process sees one MIG device however many it is given.

What the documentation leaves out is taken from PyTorch's model of the driver, which
counts the visible devices without creating a CUDA context (pytorch/pytorch,
torch/cuda/__init__.py: _parse_visible_devices, _strtoul, _transform_uuid_to_ordinals):

- the first entry sets the list's kind: a list that begins with `GPU-` is read as GPU
  UUIDs, one that begins with `MIG-` as MIG devices, any other as indices; the first
  entry of another kind ends it ("Anything other but prefix is ignored"; in a list of
  indices a UUID reads as no number, which "aborts the sequence"), so `0,GPU-...`
  shows GPU 0 only;
- an index is read as strtoul reads it ("something like strtoul"): spaces around it,
  an optional sign, then digits, whatever follows ignored: `1gpu` and `+1` are 1, and an
  entry that begins with no digit ends the list as an invalid index does;
- an unknown or ambiguous UUID ends the list as an invalid index does ("First invalid
  ordinal stops parsing");
- a GPU named twice leaves no device visible at all ("Repeated ordinal results in empty
  set", "Duplicates result in empty set").

Spaces around a UUID entry depart from it: PyTorch's model takes no UUID after a space
(the entry is of no kind), nodecheck takes it with a warning to remove them. None of
this was checked on a GPU here.

What nodecheck does with each (`exec` refuses with exit 2 and one line):

- a GPU named twice (0,0; two prefixes of one UUID): every rank is refused. CUDA then
  sees no GPU; were it to see both, two ranks would drive one GPU bound to the same
  CPUs. Either way the job is not what was meant.
- an entry that names no GPU here (an index past the last, an unknown or ambiguous
  UUID, a MIG instance the driver does not list, an entry of another kind than the
  first, anything else): CUDA stops there. The ranks before it run as CUDA will run
  them, each warned, in `tune`'s output and `exec`'s stderr, that CUDA sees no more;
  the ranks from it on have no GPU, and `exec` refuses them naming the entry, as it
  refuses any rank past the visible GPUs.
- an entry nodecheck cannot map (a UUID, or a prefix that begins one known UUID, where
  another GPU's UUID is unreadable; the parent of a `MIG-<uuid>` not determinable):
  "could not determine", never a guessed GPU. CUDA may see it, so the ranks before it
  are warned, and `exec` refuses the ranks from it on, saying why: binding them next to
  a guessed GPU is what this module exists to avoid. A whole UUID is certain: UUIDs are
  unique and of one length, so no unreadable one can begin with it.
- a second MIG device: CUDA enumerates one MIG device per process (NVIDIA's MIG user
  guide, "CUDA Device Enumeration"): rank 0 runs on the first, warned; a rank past it
  has no GPU, and `exec` refuses it (torch.cuda.set_device(1) would fail).
- a negative index: the documented way to end the list: a note when entries follow.

UUIDs come from the nvidia driver's information files (checks/node/gpu_identities.py),
not NVML: they answer without nvmlInit, which `tune` must not pay. A `MIG-<uuid>` is
named nowhere in the driver's files; its parent is the one GPU here whose MIG compute
instances the driver lists (inside a container, libnvidia-container mounts only the
given instances' capability files: NVIDIA/libnvidia-container src/nvc_mount.c,
mount_procfs_mig), and cannot be determined where several GPUs list instances.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field

from nodecheck.checks.node.gpu_identities import DriverGpu, GpuIdentities, MigInstance
from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.node.pci import PciDevice
from nodecheck.checks.record import record

VARIABLE = "CUDA_VISIBLE_DEVICES"
GPU_PREFIX = "GPU-"
MIG_PREFIX = "MIG-"
# MIG-GPU-<GPU UUID>/<GPU instance ID>/<compute instance ID>
_LEGACY_MIG = LazyPattern(r"MIG-(GPU-[^/]+)/([0-9]{1,9})/([0-9]{1,9})")
# strtoul's reading of an index: an optional sign, then digits (what follows is ignored).
_LEADING_INTEGER = LazyPattern(r"([+-]?)([0-9]+)")
# Past 9 digits no GPU index is meant (and int() refuses over 4300): past every GPU.
_MAX_INDEX_DIGITS = 9
NOT_EXPOSED = "it is not in /proc/driver/nvidia/gpus"


def read_index(text: str) -> int | None:
    """The index an entry gives, read as strtoul reads it (PyTorch's _strtoul): spaces
    around it, an optional sign, then digits, whatever follows ignored (`1gpu` and `+1`
    are 1); None when it begins with no digit. Negative: the documented end of the list."""
    match = _LEADING_INTEGER.match(text.strip())
    if match is None:
        return None
    sign, digits = match.groups()
    digits = digits.lstrip("0") or "0"
    index = int(digits) if len(digits) <= _MAX_INDEX_DIGITS else 10**_MAX_INDEX_DIGITS
    return -index if sign == "-" else index


def _list_kind(entries: Sequence[str]) -> str:
    """What the list names, from its first entry (PyTorch's _parse_visible_devices): GPU
    UUIDs (GPU_PREFIX), MIG devices (MIG_PREFIX) or indices ("")."""
    first = entries[0].strip()
    return next((prefix for prefix in (GPU_PREFIX, MIG_PREFIX) if first.startswith(prefix)), "")


def names_gpus_by_id(environ: Mapping[str, str]) -> bool:
    """Whether CUDA_VISIBLE_DEVICES names GPUs by UUID or MIG device (what needs the
    driver's GPU identities): a list of indices ends at its first UUID, so only a list
    that begins with one does."""
    return _list_kind(environ.get(VARIABLE, "").split(",")) != ""


@record
class VisibleDevices:
    """The GPUs CUDA enumerates, in its order (local rank N drives `gpus[N]`).

    `notes`: how entries were mapped (Slurm's renumbering, a UUID's GPU, a MIG device's
    parent). `warnings`: what CUDA will do that the variable does not say, for every
    visible rank to be warned of. `stop`: why no GPU is seen or placed from some entry
    on (at all, when `gpus` is empty): `exec` refuses a rank past `gpus` with it."""

    gpus: list[PciDevice]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stop: str = ""


@record
class _Found:
    """One entry's GPU, or why there is none: `certain` False when CUDA may well see a
    GPU there that nodecheck cannot tell (could not determine)."""

    gpu: PciDevice | None
    why: str = ""
    certain: bool = True


def _entry(position: int, text: str) -> str:
    return f"entry {position} ({text!r})"


def _named(position: int, text: str) -> str:
    return f"{VARIABLE} {_entry(position, text)}"


def _names(gpus: Sequence[PciDevice]) -> str:
    return ", ".join(gpu.bdf for gpu in gpus)


class _Reading:
    """One reading of CUDA_VISIBLE_DEVICES: each entry to its GPU, or why not."""

    def __init__(
        self, gpus: list[PciDevice], index_space: list[PciDevice], identities: GpuIdentities | None
    ) -> None:
        self.gpus = gpus
        self.index_space = index_space
        self.identities = identities
        self.notes: list[str] = []
        self.warnings: list[str] = []

    def driver_gpu(self, gpu: PciDevice) -> DriverGpu:
        """What the driver's files say of a GPU (nothing, for one they do not show)."""
        found = None if self.identities is None else self.identities.by_bus_id.get(gpu.bdf)
        if found is None:
            return DriverGpu(gpu.bdf, None, None, None, NOT_EXPOSED, NOT_EXPOSED)
        return found

    def nothing_known(self) -> str:
        """Why nothing of the driver's GPU identities is known ("" when it is)."""
        if self.identities is None:
            return "the nvidia driver's GPU identities were not read"
        if self.identities.problem:
            return f"the nvidia driver's GPU list could not be read ({self.identities.problem})"
        return ""

    def by_index(self, shown: str, index: int) -> _Found:
        if index < len(self.index_space):
            return _Found(self.index_space[index])
        among = "of the job's GPUs" if self.index_space is not self.gpus else "GPUs here"
        return _Found(
            None, f"{shown} is index {index}, and CUDA numbers {len(self.index_space)} {among}"
        )

    def by_uuid(self, shown: str, uuid: str) -> _Found:
        """The one GPU whose UUID begins with `uuid` (CUDA's abbreviated form)."""
        nothing = self.nothing_known()
        if nothing:
            return _Found(
                None, f"nodecheck cannot tell which GPU {shown} names: {nothing}", certain=False
            )
        matches = [gpu for gpu in self.gpus if self.driver_gpu(gpu).begins_with(uuid)]
        unknown = [gpu for gpu in self.gpus if self.driver_gpu(gpu).uuid is None]
        why_unknown = "; ".join(
            f"{gpu.bdf}: {self.driver_gpu(gpu).uuid_unknown_why}" for gpu in unknown
        )
        if len(matches) > 1:
            return _Found(
                None,
                f"{shown} begins the UUIDs of GPUs {_names(matches)}, and CUDA needs enough of "
                "a UUID to name one GPU",
            )
        if not matches:
            if unknown:
                return _Found(
                    None,
                    f"nodecheck cannot tell which GPU {shown} names: it begins no UUID the "
                    f"nvidia driver gives, and the UUID of GPU {_names(unknown)} is not known "
                    f"({why_unknown})",
                    certain=False,
                )
            return _Found(None, f"{shown} is the UUID of no GPU here")
        [gpu] = matches
        if unknown and self.driver_gpu(gpu).uuid != uuid:
            # A prefix only: the unknown UUID may begin the same way. A whole UUID is
            # certain, as UUIDs are unique and of one length.
            return _Found(
                None,
                f"nodecheck cannot tell which GPU {shown} names: it begins GPU {gpu.bdf}'s "
                f"UUID, but the UUID of GPU {_names(unknown)} is not known ({why_unknown}), "
                "and if it begins the same way, CUDA finds the entry ambiguous and stops there",
                certain=False,
            )
        return _Found(gpu)

    def gpu_entry(self, shown: str, uuid: str) -> _Found:
        found = self.by_uuid(shown, uuid)
        if found.gpu is not None:
            self.notes.append(
                f"{shown} is GPU {found.gpu.bdf}, by its UUID in the nvidia "
                "driver's information file"
            )
        return found

    def legacy_mig_entry(self, shown: str, uuid: str, instance: MigInstance) -> _Found:
        """The parent of `MIG-GPU-<uuid>/<gi>/<ci>`: the GPU of that UUID."""
        found = self.by_uuid(shown, uuid)
        if found.gpu is None:
            return found
        parent = self.driver_gpu(found.gpu)
        gi, ci = instance.gpu_instance, instance.compute_instance
        if parent.mig_instances is not None and not parent.lists(instance):
            return _Found(
                None,
                f"{shown} names MIG instance {gi}/{ci} of GPU {parent.bdf}, which the nvidia "
                f"driver does not list (capabilities/gpu{parent.minor}/mig/gi{gi}/ci{ci})",
            )
        self.notes.append(
            f"{shown} is MIG instance {gi}/{ci} of GPU {parent.bdf} (by its UUID in "
            "the nvidia driver's information file): its rank is bound next to that GPU"
        )
        return found

    def mig_entry(self, shown: str) -> _Found:
        """The parent of `MIG-<uuid>`: no file of the driver's names a MIG device's UUID,
        so the one GPU here whose MIG instances the driver lists, when there is one."""
        nothing = self.nothing_known()
        if nothing:
            return _Found(
                None, f"nodecheck cannot tell which GPU holds {shown}: {nothing}", certain=False
            )
        listing = [gpu for gpu in self.gpus if self.driver_gpu(gpu).mig_instances]
        unread = [gpu for gpu in self.gpus if self.driver_gpu(gpu).mig_instances is None]
        if len(listing) == 1 and not unread:
            [parent] = listing
            self.notes.append(
                f"{shown} is a MIG device: the nvidia driver's files name no MIG "
                f"device's UUID, and GPU {parent.bdf} is the only GPU here whose MIG instances "
                "it lists (/proc/driver/nvidia/capabilities), so it is that GPU's"
            )
            if len(self.driver_gpu(parent).mig_instances or ()) > 1:
                self.warnings.append(
                    f"GPU {parent.bdf} holds several MIG instances: this rank is bound next to "
                    "it as if it had the GPU to itself, and processes on its other instances, "
                    "tuned alone, get the same CPUs"
                )
            return _Found(parent)
        if not listing and not unread:
            return _Found(
                None,
                f"{shown} is a MIG device, and no GPU here has a MIG instance "
                "(/proc/driver/nvidia/capabilities/gpu*/mig)",
            )
        said = [f"GPUs {_names(listing)} list MIG instances"] if listing else []
        said += [f"GPU {gpu.bdf}'s: {self.driver_gpu(gpu).mig_problem}" for gpu in unread]
        return _Found(
            None,
            f"nodecheck cannot tell which GPU holds {shown}: the nvidia driver's files name "
            "no MIG device's UUID (NVML does: nvidia-smi -L lists it under its GPU), and "
            + "; ".join(said),
            certain=False,
        )

    def entry(self, position: int, raw: str, kind: str) -> _Found:
        """One entry's GPU, or why there is none, in a list of `kind` (_list_kind)."""
        text = raw.strip()
        shown = _named(position, text)
        if kind == "":
            index = read_index(text)
            if index is not None:
                return self.by_index(shown, index)
            if text.startswith((GPU_PREFIX, MIG_PREFIX)):
                return _Found(None, _of_another_kind(shown, "an index"))
            return _Found(None, f"{shown} is no index, GPU UUID or MIG device")
        if not text.startswith(kind):
            first = "a GPU UUID" if kind == GPU_PREFIX else "a MIG device"
            return _Found(None, _of_another_kind(shown, first))
        if text != raw:
            self.warnings.append(
                f"{_named(position, raw)} has spaces around it: taken as {text!r}, "
                "but what the driver makes of them is not documented, and PyTorch's model of "
                "it (torch.cuda.device_count) takes no UUID after a space: remove them"
            )
        legacy = _LEGACY_MIG.fullmatch(text)
        if legacy is not None:
            instance = MigInstance(int(legacy.group(2)), int(legacy.group(3)))
            return self.legacy_mig_entry(shown, legacy.group(1), instance)
        if kind == GPU_PREFIX:
            return self.gpu_entry(shown, text)
        return self.mig_entry(shown)


def _of_another_kind(shown: str, first: str) -> str:
    """Why an entry of another kind than the list's first ends it."""
    return (
        f"{shown} is of another kind than entry 1, {first}: the driver as PyTorch models it "
        "reads the whole list as the first entry's kind and ends it there "
        "(torch/cuda/__init__.py, _parse_visible_devices)"
    )


def _index_space(
    gpus: list[PciDevice], indices: list[int], allocated: list[PciDevice]
) -> list[PciDevice]:
    """What CUDA's indices count: the GPUs here, or the job's GPUs when Slurm's
    ConstrainDevices renumbered them (the device cgroup hides the others from CUDA, not
    from sysfs, and Slurm numbers CUDA_VISIBLE_DEVICES from 0 among the job's GPUs): told
    apart by indices that name GPUs outside the job's list yet fit its length."""
    outside = any(index >= len(gpus) or gpus[index] not in allocated for index in indices)
    if allocated and outside and all(index < len(allocated) for index in indices):
        return allocated
    return gpus


def _ranks(count: int) -> str:
    return "local rank 0" if count == 1 else f"local ranks 0-{count - 1}"


def _stopped(found: _Found, seen: int) -> str:
    """What CUDA does at an entry that names no GPU nodecheck can place, `seen` GPUs in."""
    if not found.certain:
        placed = (
            f"; the {seen} GPU(s) before it are placed ({_ranks(seen)}), a rank past them is not"
            if seen
            else ""
        )
        return f"{found.why}: CUDA may see a GPU there, but nodecheck cannot place it{placed}"
    if seen:
        return (
            f"{found.why}: CUDA stops there and sees only the {seen} GPU(s) before "
            f"it ({_ranks(seen)}); a rank past them has no GPU"
        )
    return f"{found.why}: CUDA stops there and sees no GPU"


def resolve_visible_devices(
    gpus: list[PciDevice],
    environ: Mapping[str, str],
    identities: GpuIdentities | None = None,
    allocated: list[PciDevice] | None = None,
) -> VisibleDevices:
    """The GPUs CUDA enumerates among `gpus` (those meant for this host and container, in
    PCI bus order), as CUDA_VISIBLE_DEVICES says. `allocated`: the job's GPUs as Slurm
    lists them (SLURM_STEP_GPUS, else SLURM_JOB_GPUS); `identities`: the driver's UUIDs
    and MIG instances (None: not read, so no UUID can be mapped)."""
    raw = environ.get(VARIABLE)
    if raw is None:
        return VisibleDevices(list(gpus))
    if not raw.strip():
        return VisibleDevices([])  # set and empty: CUDA sees no GPU, as documented
    entries = raw.split(",")
    kind = _list_kind(entries)
    indices = []
    for item in entries if kind == "" else ():
        index = read_index(item)
        if index is None or index < 0:
            break
        indices.append(index)
    space = _index_space(gpus, indices, allocated or [])
    reading = _Reading(gpus, space, identities)
    picked: list[PciDevice] = []
    named_at: dict[str, int] = {}
    named_text: dict[str, int] = {}
    stop = ""
    for position, item in enumerate(entries, start=1):
        text = item.strip()
        index = read_index(text)
        if index is not None and index < 0:
            after = len(entries) - position
            if after:
                reading.notes.append(
                    f"{VARIABLE} ends at {_entry(position, text)}, as CUDA documents for an "
                    "invalid index: "
                    + (
                        "the entry after it is"
                        if after == 1
                        else f"the {after} entries after it are"
                    )
                    + " not seen"
                )
            break
        if kind == MIG_PREFIX and text in named_text:
            # The same MIG device twice: a repeat, which leaves no device at all (torch's
            # model, parse_list_with_prefix: "Repeated id results in empty set"), before
            # the one-MIG-device rule below would make it a second device.
            return VisibleDevices(
                [],
                reading.notes,
                stop=(
                    f"{VARIABLE} names MIG device {text!r} twice, "
                    f"{_entry(named_text[text], text)} and {_entry(position, text)}: CUDA then "
                    "enumerates no device at all (the driver as PyTorch models it, "
                    "torch/cuda/__init__.py); name each device once"
                ),
            )
        named_text.setdefault(text, position)
        if kind == MIG_PREFIX and picked and text.startswith(MIG_PREFIX):
            second = (
                f"{_named(position, text)} is a second MIG device, and CUDA enumerates one "
                'MIG device per process (NVIDIA\'s MIG user guide, "CUDA Device Enumeration"), '
                "entry 1's"
            )
            stop = _stopped(_Found(None, second), len(picked))
            break
        found = reading.entry(position, item, kind)
        if found.gpu is None:
            stop = _stopped(found, len(picked))
            break
        first = named_at.get(found.gpu.bdf, 0)
        if first:
            return VisibleDevices(
                [],
                reading.notes,
                stop=(
                    f"{VARIABLE} names GPU {found.gpu.bdf} twice, "
                    f"{_entry(first, entries[first - 1].strip())} and {_entry(position, text)}: "
                    "CUDA then enumerates no GPU at all (the driver as PyTorch models it, "
                    "torch/cuda/__init__.py: a repeated device leaves an empty set), and were "
                    "it to enumerate both, two ranks would drive one GPU bound to the same "
                    "CPUs; name each GPU once"
                ),
            )
        named_at[found.gpu.bdf] = position
        picked.append(found.gpu)
    if space is not gpus and picked:
        reading.notes.insert(
            0,
            f"{VARIABLE}={raw} counts among the job's GPUs (Slurm's ConstrainDevices numbers "
            f"them from 0), so it means {_names(picked)}",
        )
    if stop and picked:
        reading.warnings.append(f"{stop} (nodecheck exec refuses such a rank)")
    return VisibleDevices(picked, reading.notes, reading.warnings, stop)
