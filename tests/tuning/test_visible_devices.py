"""CUDA_VISIBLE_DEVICES in every form CUDA accepts, on literal environments: four literal
GPUs, the nvidia driver's identities of them as literal values, and what CUDA sees."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nodecheck.checks.node.gpu_identities import DriverGpu, GpuIdentities, MigInstance
from nodecheck.checks.node.pci import PciDevice
from nodecheck.tuning.bindings import sharing_gpus, visible_devices, visible_gpus
from nodecheck.tuning.visible_devices import VisibleDevices, names_gpus_by_id

BUS_IDS = ("0000:18:00.0", "0000:3a:00.0", "0000:9c:00.0", "0000:bc:00.0")
GPUS = [PciDevice(bdf, Path("/sys/bus/pci/devices") / bdf, (bdf,), "pci0000:00") for bdf in BUS_IDS]
# GPUs 0 and 1 share their UUIDs' first ten characters, as two GPUs of one batch can.
UUIDS = (
    "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
    "GPU-8932f9aa-0b1c-4d2e-8f30-415263748596",
    "GPU-5a88edbe-90c4-2449-8c43-70c57591cca1",
    "GPU-0c519389-096c-c814-1d2e-3f4a5b6c7d8e",
)
IDENTITIES = GpuIdentities(
    {
        bdf: DriverGpu(bdf, uuid, minor)
        for minor, (bdf, uuid) in enumerate(zip(BUS_IDS, UUIDS, strict=True))
    }
)


def seen(
    visible: str,
    identities: GpuIdentities | None = IDENTITIES,
    slurm: dict[str, str] | None = None,
) -> VisibleDevices:
    environ = {"CUDA_VISIBLE_DEVICES": visible, **(slurm or {})}
    return visible_devices(GPUS, environ, None, identities)


def bus_ids(found: VisibleDevices) -> list[str]:
    return [gpu.bdf for gpu in found.gpus]


def with_gpu(identities: GpuIdentities, index: int, **changes: Any) -> GpuIdentities:
    """The identities with GPU `index`'s record changed."""
    bdf = BUS_IDS[index]
    changed = replace(identities.by_bus_id[bdf], **changes)
    return GpuIdentities({**identities.by_bus_id, bdf: changed})


def test_unset_and_empty() -> None:
    assert visible_gpus(GPUS, {}) == GPUS
    empty = seen("")
    assert empty.gpus == [] and not empty.warnings and empty.stop == ""


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("2,0", [2, 0]),  # in the order given
        (" 1 , 0 ", [1, 0]),  # spaces around an index are ignored, as strtoul does
        (UUIDS[2], [2]),
        ("GPU-5a88", [2]),  # a prefix that names one GPU
        ("GPU-8932f937", [0]),  # longer than the prefix GPUs 0 and 1 share
        (f"GPU-5a88,{UUIDS[3]}", [2, 3]),  # a prefix and a whole UUID
        # strtoul's reading (PyTorch's _strtoul): a sign, digits, the rest ignored
        ("1gpu,+2, 3 x", [1, 2, 3]),
    ],
)
def test_indices_uuids_and_unique_prefixes(visible: str, expected: list[int]) -> None:
    found = seen(visible)
    assert bus_ids(found) == [BUS_IDS[i] for i in expected]
    assert found.warnings == [] and found.stop == ""


def test_a_uuid_entry_says_which_gpu_it_is() -> None:
    [note] = seen("GPU-5a88").notes
    assert note == (
        "CUDA_VISIBLE_DEVICES entry 1 ('GPU-5a88') is GPU 0000:9c:00.0, by its UUID in the "
        "nvidia driver's information file"
    )


def test_an_ambiguous_prefix_is_where_cuda_stops() -> None:
    found = seen(f"{UUIDS[2]},GPU-8932f9,{UUIDS[1]}")
    assert bus_ids(found) == [BUS_IDS[2]]
    assert found.stop == (
        "CUDA_VISIBLE_DEVICES entry 2 ('GPU-8932f9') begins the UUIDs of GPUs 0000:18:00.0, "
        "0000:3a:00.0, and CUDA needs enough of a UUID to name one GPU: CUDA stops there and "
        "sees only the 1 GPU(s) before it (local rank 0); a rank past them has no GPU"
    )
    assert found.warnings == [f"{found.stop} (nodecheck exec refuses such a rank)"]


@pytest.mark.parametrize(
    ("visible", "before", "why"),
    [
        (f"{UUIDS[1]},GPU-ffffffff,2", [1], "entry 2 ('GPU-ffffffff') is the UUID of no GPU here"),
        ("0,3,4", [0, 3], "entry 3 ('4') is index 4, and CUDA numbers 4 GPUs here"),
        ("1,abc1", [1], "entry 2 ('abc1') is no index, GPU UUID or MIG device"),
        ("2,+", [2], "entry 2 ('+') is no index, GPU UUID or MIG device"),
        ("0,,1", [0], "entry 2 ('') is no index, GPU UUID or MIG device"),
        ("gpu-5a88", [], "entry 1 ('gpu-5a88') is no index, GPU UUID or MIG device"),
        ("7", [], "entry 1 ('7') is index 7, and CUDA numbers 4 GPUs here"),
    ],
)
def test_an_unknown_entry_is_where_cuda_stops(visible: str, before: list[int], why: str) -> None:
    found = seen(visible)
    assert bus_ids(found) == [BUS_IDS[i] for i in before]
    assert found.stop.startswith(f"CUDA_VISIBLE_DEVICES {why}: CUDA stops there")
    # The ranks that run are told; with none, the plan says it instead.
    assert len(found.warnings) == (1 if before else 0)


MIG_UUID = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"


@pytest.mark.parametrize(
    ("visible", "before", "why"),
    [
        ("0,GPU-5a88,1", [0], "entry 2 ('GPU-5a88') is of another kind than entry 1, an index"),
        (f"3,{MIG_UUID}", [3], f"entry 2 ('{MIG_UUID}') is of another kind than entry 1, an index"),
        ("GPU-5a88,0", [2], "entry 2 ('0') is of another kind than entry 1, a GPU UUID"),
        (f"GPU-5a88,{MIG_UUID}", [2], f"entry 2 ('{MIG_UUID}') is of another kind than entry 1"),
        (f"{MIG_UUID},1", [2], "entry 2 ('1') is of another kind than entry 1, a MIG device"),
    ],
)
def test_the_first_entry_sets_the_list_s_kind(visible: str, before: list[int], why: str) -> None:
    """PyTorch's model of the driver (_parse_visible_devices): a list is read as its first
    entry's kind, and the first entry of another kind ends it."""
    found = seen(visible, with_gpu(IDENTITIES, 2, mig_instances=(MigInstance(1, 0),)))
    assert bus_ids(found) == [BUS_IDS[i] for i in before]
    assert found.stop.startswith(f"CUDA_VISIBLE_DEVICES {why}")
    assert "the driver as PyTorch models it reads the whole list as the first entry's kind" in (
        found.stop
    )
    assert found.stop.endswith(
        "CUDA stops there and sees only the 1 GPU(s) before it (local rank 0); a rank past "
        "them has no GPU"
    )


def test_a_negative_index_ends_the_list_as_documented() -> None:
    """CUDA's own example: 0,2,-1,1 shows 0 and 2. The terminator is a note, not a
    warning: it is how one hides GPUs on purpose."""
    found = seen("0,2,-1,1")
    assert bus_ids(found) == [BUS_IDS[0], BUS_IDS[2]]
    assert found.warnings == [] and found.stop == ""
    assert found.notes == [
        "CUDA_VISIBLE_DEVICES ends at entry 3 ('-1'), as CUDA documents for an invalid "
        "index: the entry after it is not seen"
    ]
    assert seen("-1").gpus == [] and seen("-1").notes == []


@pytest.mark.parametrize(
    ("visible", "gpu", "first", "second"),
    [
        ("0,0", 0, "entry 1 ('0')", "entry 2 ('0')"),
        ("3, 2 ,2", 2, "entry 2 ('2')", "entry 3 ('2')"),
        ("1,1gpu", 1, "entry 1 ('1')", "entry 2 ('1gpu')"),
        ("+3,3", 3, "entry 1 ('+3')", "entry 2 ('3')"),
        ("GPU-5a88,GPU-5a88edbe", 2, "entry 1 ('GPU-5a88')", "entry 2 ('GPU-5a88edbe')"),
    ],
)
def test_a_gpu_named_twice_leaves_none(visible: str, gpu: int, first: str, second: str) -> None:
    """PyTorch's model of the driver: a repeated device leaves an empty set; and were
    CUDA to enumerate both, two ranks would drive one GPU with the same CPUs."""
    found = seen(visible)
    assert found.gpus == []
    assert found.stop == (
        f"CUDA_VISIBLE_DEVICES names GPU {BUS_IDS[gpu]} twice, {first} and {second}: CUDA "
        "then enumerates no GPU at all (the driver as PyTorch models it, "
        "torch/cuda/__init__.py: a repeated device leaves an empty set), and were it to "
        "enumerate both, two ranks would drive one GPU bound to the same CPUs; name each GPU "
        "once"
    )


def test_a_duplicate_after_the_stop_is_never_reached() -> None:
    """CUDA stops at the invalid entry before it meets the repeated one."""
    assert bus_ids(seen("0,-1,0")) == [BUS_IDS[0]]


def test_spaces_around_a_uuid_are_taken_with_a_warning() -> None:
    found = seen("GPU-8932f937, GPU-5a88")
    assert bus_ids(found) == [BUS_IDS[0], BUS_IDS[2]]
    [warning] = found.warnings
    assert warning.startswith(
        "CUDA_VISIBLE_DEVICES entry 2 (' GPU-5a88') has spaces around it: taken as 'GPU-5a88'"
    )
    assert "takes no UUID after a space: remove them" in warning


def test_a_uuid_cannot_be_mapped_without_the_driver_s_identities() -> None:
    """Could not determine is its own outcome: never "all GPUs", never a guessed one."""
    unread = seen("GPU-5a88", None)
    said = (
        "nodecheck cannot tell which GPU CUDA_VISIBLE_DEVICES entry 1 ('GPU-5a88') names: the "
        "nvidia driver's GPU identities were not read: CUDA may see a GPU there, but nodecheck "
        "cannot place it"
    )
    assert (unread.gpus, unread.stop) == ([], said)
    broken = seen("GPU-5a88", GpuIdentities({}, problem="/proc/driver/nvidia/gpus: EACCES"))
    assert broken.gpus == []
    assert "the nvidia driver's GPU list could not be read (/proc/driver/nvidia/gpus: EACCES)" in (
        broken.stop
    )


def test_a_gpu_without_a_uuid_line_makes_unmatched_entries_unknown() -> None:
    """GPU 3's information file printed no UUID (rm_get_gpu_uuid gave none): an entry
    that matches no known UUID may be its, and so may a prefix that begins one known UUID
    (CUDA would find it ambiguous): could not determine; a whole UUID is certain."""
    identities = with_gpu(IDENTITIES, 3, uuid=None)
    unknown = seen("GPU-0c51", identities)
    assert unknown.gpus == []
    assert unknown.stop == (
        "nodecheck cannot tell which GPU CUDA_VISIBLE_DEVICES entry 1 ('GPU-0c51') names: it "
        "begins no UUID the nvidia driver gives, and the UUID of GPU 0000:bc:00.0 is not known "
        "(0000:bc:00.0: its information file prints no GPU UUID line): CUDA may see a GPU "
        "there, but nodecheck cannot place it"
    )
    prefix = seen(f"{UUIDS[1]},GPU-5a88,0", identities)
    assert bus_ids(prefix) == [BUS_IDS[1]]
    assert prefix.stop == (
        "nodecheck cannot tell which GPU CUDA_VISIBLE_DEVICES entry 2 ('GPU-5a88') names: it "
        "begins GPU 0000:9c:00.0's UUID, but the UUID of GPU 0000:bc:00.0 is not known "
        "(0000:bc:00.0: its information file prints no GPU UUID line), and if it begins the "
        "same way, CUDA finds the entry ambiguous and stops there: CUDA may see a GPU there, "
        "but nodecheck cannot place it; the 1 GPU(s) before it are placed (local rank 0), a "
        "rank past them is not"
    )
    assert prefix.warnings == [f"{prefix.stop} (nodecheck exec refuses such a rank)"]
    whole = seen(f"{UUIDS[1]},{UUIDS[2]}", identities)
    assert bus_ids(whole) == [BUS_IDS[1], BUS_IDS[2]] and whole.warnings == []


def test_a_gpu_the_driver_does_not_show_has_no_known_uuid() -> None:
    """A GPU on the bus whose driver folder is absent (none read) cannot be matched."""
    partial = GpuIdentities({bdf: IDENTITIES.by_bus_id[bdf] for bdf in BUS_IDS[:3]})
    found = seen("GPU-ffff", partial)
    assert "0000:bc:00.0: it is not in /proc/driver/nvidia/gpus" in found.stop


MIG_LISTED = with_gpu(IDENTITIES, 2, mig_instances=(MigInstance(1, 0),))


def test_the_legacy_mig_form_binds_next_to_its_parent() -> None:
    """MIG-<GPU-UUID>/<GPU instance>/<compute instance> (drivers R450, R460) names its
    parent: the GPU of that UUID; an instance the driver does not list is unknown."""
    found = seen(f"MIG-{UUIDS[2]}/1/0", MIG_LISTED)
    assert bus_ids(found) == [BUS_IDS[2]] and found.warnings == []
    assert found.notes == [
        f"CUDA_VISIBLE_DEVICES entry 1 ('MIG-{UUIDS[2]}/1/0') is MIG instance 1/0 of GPU "
        "0000:9c:00.0 (by its UUID in the nvidia driver's information file): its rank is "
        "bound next to that GPU"
    ]
    missing = seen(f"MIG-{UUIDS[2]}/3/0", MIG_LISTED)
    assert missing.gpus == []
    assert missing.stop == (
        f"CUDA_VISIBLE_DEVICES entry 1 ('MIG-{UUIDS[2]}/3/0') names MIG instance 3/0 of GPU "
        "0000:9c:00.0, which the nvidia driver does not list (capabilities/gpu2/mig/gi3/ci0): "
        "CUDA stops there and sees no GPU"
    )
    # Instances that could not be listed: the instance is not refuted, its parent stands.
    unlisted = with_gpu(IDENTITIES, 2, mig_instances=None, mig_problem="EACCES")
    assert bus_ids(seen(f"MIG-{UUIDS[2]}/3/0", unlisted)) == [BUS_IDS[2]]
    unknown_parent = seen("MIG-GPU-ffffffff/1/0", MIG_LISTED)
    assert "entry 1 ('MIG-GPU-ffffffff/1/0') is the UUID of no GPU here" in unknown_parent.stop


def test_a_mig_uuid_is_the_one_gpu_listing_mig_instances() -> None:
    """MIG-<uuid> (R470 on) is named in no file of the driver's; its parent is the one GPU
    here whose MIG instances the driver lists (in a container given one MIG device, its
    own)."""
    found = seen(MIG_UUID, MIG_LISTED)
    assert bus_ids(found) == [BUS_IDS[2]] and found.warnings == []
    assert "GPU 0000:9c:00.0 is the only GPU here whose MIG instances it lists" in found.notes[0]
    shared = with_gpu(IDENTITIES, 2, mig_instances=(MigInstance(1, 0), MigInstance(2, 0)))
    [warning] = seen(MIG_UUID, shared).warnings
    assert warning.startswith("GPU 0000:9c:00.0 holds several MIG instances")


def test_a_mig_uuid_among_several_mig_gpus_cannot_be_placed() -> None:
    two = with_gpu(MIG_LISTED, 0, mig_instances=(MigInstance(2, 0),))
    found = seen(MIG_UUID, two)
    assert found.gpus == []
    assert found.stop == (
        f"nodecheck cannot tell which GPU holds CUDA_VISIBLE_DEVICES entry 1 ('{MIG_UUID}'): the "
        "nvidia driver's files name no MIG device's UUID (NVML does: nvidia-smi -L lists it under "
        "its GPU), and GPUs 0000:18:00.0, 0000:9c:00.0 list MIG instances: CUDA may see a GPU "
        "there, but nodecheck cannot place it"
    )
    unlisted = with_gpu(MIG_LISTED, 0, mig_instances=None, mig_problem="EIO")
    assert "GPU 0000:18:00.0's: EIO" in seen(MIG_UUID, unlisted).stop


def test_a_mig_uuid_where_no_gpu_has_mig_instances_is_unknown() -> None:
    found = seen(MIG_UUID)
    assert found.gpus == []
    assert found.stop.endswith(
        "is a MIG device, and no GPU here has a MIG instance "
        "(/proc/driver/nvidia/capabilities/gpu*/mig): CUDA stops there and sees no GPU"
    )


SECOND_MIG = "MIG-0f9e8d7c-0000-5000-8000-000000000001"


def test_a_second_mig_device_is_not_seen() -> None:
    """CUDA enumerates one MIG device per process (MIG user guide, "CUDA Device
    Enumeration"): rank 0 runs on the first, warned; a rank past it has no GPU."""
    found = seen(f"{MIG_UUID},{SECOND_MIG}", MIG_LISTED)
    assert bus_ids(found) == [BUS_IDS[2]]
    assert found.stop == (
        f"CUDA_VISIBLE_DEVICES entry 2 ('{SECOND_MIG}') is a second MIG device, and CUDA "
        "enumerates one MIG device per process (NVIDIA's MIG user guide, \"CUDA Device "
        "Enumeration\"), entry 1's: CUDA stops there and sees only the 1 GPU(s) before it "
        "(local rank 0); a rank past them has no GPU"
    )
    assert found.warnings == [f"{found.stop} (nodecheck exec refuses such a rank)"]
    legacy = seen(f"MIG-{UUIDS[2]}/1/0,MIG-{UUIDS[2]}/2/0", MIG_LISTED)
    assert bus_ids(legacy) == [BUS_IDS[2]] and "is a second MIG device" in legacy.stop


@pytest.mark.parametrize("device", [MIG_UUID, f"MIG-{UUIDS[2]}/1/0"])
def test_a_mig_device_named_twice_leaves_none(device: str) -> None:
    """A repeat, not a second device: torch's model leaves no device at all."""
    found = seen(f"{device},{device}", MIG_LISTED)
    assert found.gpus == [] and f"names MIG device {device!r} twice" in found.stop


def test_slurm_renumbering_keeps_working_beside_uuids() -> None:
    """ConstrainDevices: the job has GPUs 2 and 3, CUDA numbers them 0 and 1; a UUID names
    its GPU whatever the numbering."""
    step = {"SLURM_STEP_GPUS": "2,3"}
    renumbered = seen("0,1", slurm=step)
    assert bus_ids(renumbered) == [BUS_IDS[2], BUS_IDS[3]]
    assert "counts among the job's GPUs" in renumbered.notes[0]
    by_uuid = seen(f"{UUIDS[0]},{UUIDS[3]}", slurm=step)
    assert bus_ids(by_uuid) == [BUS_IDS[0], BUS_IDS[3]]
    # Index 2 does not fit the job's two GPUs: the host's own numbering, as before.
    assert bus_ids(seen("0,2", slurm=step)) == [BUS_IDS[0], BUS_IDS[2]]


def test_a_task_seeing_one_gpu_by_uuid_shares_the_step() -> None:
    """srun --gpus-per-task with UUIDs: the task's GPU is one of the step's, so it takes
    its share of the socket, as with an index."""
    environ = {"CUDA_VISIBLE_DEVICES": UUIDS[3], "SLURM_STEP_GPUS": "0,1,2,3"}
    assert sharing_gpus(GPUS, environ, None, IDENTITIES) == GPUS


@pytest.mark.parametrize(
    ("visible", "needed"),
    [
        ("0,1", False),
        ("", False),
        ("GPU-5a88", True),
        (" MIG-abc,0", True),
        ("-1", False),
        # a list of indices ends at its first UUID: nothing to map
        ("0, MIG-abc", False),
    ],
)
def test_identities_are_read_only_for_uuids_and_mig_devices(visible: str, needed: bool) -> None:
    assert names_gpus_by_id({"CUDA_VISIBLE_DEVICES": visible}) is needed
