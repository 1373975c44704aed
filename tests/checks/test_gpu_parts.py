"""The parts the GPU checks, `tune` and `exec` read through checks/node: each read on a
replica tree and loaded back equal from its capture, the calling environment filtered as
it is read, `make_plan` over a loaded capture equal to the live plan, and the GPU checks
judging a literal NodeFacts."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

import pytest

from nodecheck.checks.context import CheckContext
from nodecheck.checks.gpu.count import check_gpu_count
from nodecheck.checks.gpu.state import check_gpu_state
from nodecheck.checks.node.calling_environment import read_calling_environment
from nodecheck.checks.node.cgroup import CpusetReading
from nodecheck.checks.node.coherent_gpus import CoherentGpus
from nodecheck.checks.node.facts import NodeFacts, Unread, dumps, loads
from nodecheck.checks.node.gpu import GpuProcess, GpuReading, GpuSnapshot
from nodecheck.checks.node.gpu_identities import GpuIdentities
from nodecheck.checks.node.gpu_presence import GpuPresences, answers_config_reads
from nodecheck.checks.node.nccl_platform import NcclPlatform, SharpClient
from nodecheck.checks.node.net import AddressedInterfaces
from nodecheck.checks.node.nvidia_driver import NvidiaDriver
from nodecheck.checks.node.processes import (
    GpuProcessNames,
    ProcessName,
    parse_mems_allowed,
)
from nodecheck.checks.node.torch_package import TorchVersion, parse_torch_version
from nodecheck.checks.result import NODE, Result, Status
from nodecheck.tuning.nccl import JobShape
from nodecheck.tuning.plan import PLAN_NEEDS, TuneOptions, make_plan
from tests.conftest import CLEAN_ENVIRON, Node
from tests.fixtures.nodes import SECRET
from tests.fixtures.nvml_scenarios import DGX_GPUS, FAULTY_JOB_PID

NEW_PARTS = (
    "nvidia_driver",
    "gpu_identities",
    "gpu_process_names",
    "gpu_presence",
    "coherent_gpus",
    "addressed_interfaces",
    "nccl_library",
    "nccl_platform",
    "calling_environment",
    "cpuset",
    "torch_version",
)
# The fallen-off GPU of the faulty replica: its config space reads all ones.
FALLEN_OFF = "0000:bc:00.0"


def captured(node: Node, name: str, environ: dict[str, str] | None = None) -> object:
    """Part `name` of a capture of `node`, after a trip through the JSON document."""
    facts = node.context(environ).facts
    assert hasattr(facts, "capture")
    capture: NodeFacts = facts.capture([name])
    loaded = loads(dumps(capture))
    assert loaded == capture
    value = loaded.parts[name]
    assert not isinstance(value, Unread), value
    return value


@pytest.mark.parametrize("name", NEW_PARTS)
def test_each_part_reads_the_replica_and_loads_back_equal(dgx_faulty: Node, name: str) -> None:
    value = captured(dgx_faulty, name)
    if name == "nvidia_driver":
        assert isinstance(value, NvidiaDriver)
        assert value.module_version == "570.124.06" and not value.module_error
        assert value.exposed_gpus is not None and "0000:18:00.0" in value.exposed_gpus
    elif name == "gpu_identities":
        assert isinstance(value, GpuIdentities) and not value.problem
        assert value.by_bus_id[FALLEN_OFF].uuid == "GPU-6f0c0007-1b2e-4d5c-9a7b-0000000000bc"
    elif name == "gpu_process_names":
        assert isinstance(value, GpuProcessNames)
        assert value.name_of(FAULTY_JOB_PID) == "python3"
        assert value.by_pid[FAULTY_JOB_PID].command == "python3"
    elif name == "gpu_presence":
        assert isinstance(value, GpuPresences)
        assert value.by_bus_id[FALLEN_OFF].answers is False
        assert all(value.by_bus_id[bus].answers for bus in DGX_GPUS if bus != FALLEN_OFF)
    elif name == "coherent_gpus":
        assert value == CoherentGpus({})  # no Grace here: no numa_status file
    elif name == "addressed_interfaces":
        assert isinstance(value, AddressedInterfaces) and value.names
    elif name == "nccl_platform":
        assert isinstance(value, NcclPlatform) and value.cpu_vendor == "GenuineIntel"
        assert value.sharp == SharpClient((), ())  # InfiniBand up, looked for, none installed
        assert value.imex.domain_evidence == "" and value.virtual_topology is False
    elif name == "cpuset":
        # A replica tree has no /proc/self: nothing limits the CPUs, and that is no error.
        assert value == CpusetReading(None)
    elif name == "torch_version":
        try:
            text = metadata.version("torch")
        except metadata.PackageNotFoundError:
            text = ""
        assert value == TorchVersion(parse_torch_version(text), text)


def test_the_calling_environment_keeps_only_what_tune_and_exec_read(dgx: Node) -> None:
    environ = {
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "HF_TOKEN": SECRET,
        "SLURM_NNODES": "4",
        "SLURM_JOB_ACCOUNT": SECRET,
        "LOCAL_RANK": "3",
        "OMP_NUM_THREADS": "7",
        "NCCL_DEBUG": "INFO",
        "PATH": "/usr/bin",
    }
    kept = {
        "SLURM_NNODES": "4",
        "LOCAL_RANK": "3",
        "OMP_NUM_THREADS": "7",
        "NCCL_DEBUG": "INFO",
    }
    assert read_calling_environment(environ).values == kept
    document = dumps(dgx.context(environ).facts.capture(["calling_environment"]))  # type: ignore[attr-defined]
    assert SECRET not in document and "HF_TOKEN" not in document and "SLURM_NNODES" in document


def test_parsers_on_literal_strings() -> None:
    assert parse_torch_version("2.9.1+cu128") == (2, 9) and parse_torch_version("nightly") is None
    assert parse_mems_allowed("Name:\tx\nMems_allowed_list:\t0-1,3\n") == frozenset({0, 1, 3})
    assert parse_mems_allowed("Mems_allowed_list:\tgarbage\n") is None
    assert answers_config_reads(b"\xff\xff\xff\xff") is False
    assert answers_config_reads(b"\xde\x10\x30\x23") is True
    assert answers_config_reads(b"\xde\x10") is None


@pytest.mark.parametrize("name", ["dgx-h100", "xe9680"])
def test_a_plan_over_a_loaded_capture_equals_the_live_plan(
    build: Callable[..., Node], name: str
) -> None:
    node = build(name)
    environ = {**CLEAN_ENVIRON, "SLURM_NNODES": "16", "NCCL_DEBUG": "INFO", "HF_TOKEN": SECRET}
    options = TuneOptions(shape=JobShape(None, False))
    live = make_plan(node.context(environ), options)
    capture = node.context(environ).facts.capture(PLAN_NEEDS)  # type: ignore[attr-defined]
    text = dumps(capture)
    assert SECRET not in text
    loaded = CheckContext(facts=loads(text))
    assert make_plan(loaded, options) == live
    assert live.ranks and "the job spans 16 node(s), from SLURM_NNODES" in live.notes


# -- the GPU checks on a literal NodeFacts ---------------------------------------------

BUS = "0000:18:00.0"


def literal_facts(driver: NvidiaDriver, names: GpuProcessNames) -> NodeFacts:
    gpu = GpuReading(
        0,
        BUS,
        "NVIDIA H100 80GB HBM3",
        uuid="GPU-0",
        vbios="96.00.99.00.01",
        temperature_c=40,
        slowdown_c=90,
        power_limit_w=700.0,
        default_power_limit_w=700.0,
        persistence_mode=True,
        recovery_action=0,
        processes=[GpuProcess(FAULTY_JOB_PID, 12 << 30)],
    )
    return NodeFacts(
        taken_at=1764600000.0,
        parts={
            "gpus": GpuSnapshot([gpu], driver_version="570.124.06"),
            "nvidia_driver": driver,
            "gpu_process_names": names,
        },
    )


def gpu_state(facts: NodeFacts) -> list[Result]:
    return list(check_gpu_state(CheckContext(facts=facts)))


def test_gpu_state_judges_a_literal_node() -> None:
    half_upgraded = literal_facts(
        NvidiaDriver("550.54.15", frozenset({BUS})),
        GpuProcessNames({FAULTY_JOB_PID: ProcessName("python3")}),
    )
    node, gpu = gpu_state(half_upgraded)
    assert node.subject == NODE and node.status is Status.FAIL
    assert "NVML library 570.124.06 but kernel module 550.54.15 loaded" in node.summary
    assert node.details["kernel_module_version"] == "550.54.15"
    assert "in use by python3 (4242)" in gpu.summary
    # The same facts after a round trip are judged the same.
    assert gpu_state(loads(dumps(half_upgraded))) == [node, gpu]
    # A module version that could not be read is an error, never a match; a pid outside
    # this PID namespace is "?".
    unreadable = literal_facts(
        NvidiaDriver(None, frozenset({BUS}), module_error="/proc/driver/nvidia/version: EIO"),
        GpuProcessNames({FAULTY_JOB_PID: ProcessName(None, "missing")}),
    )
    node, gpu = gpu_state(unreadable)
    assert node.status is Status.ERROR
    assert "cannot read the kernel module version: /proc/driver/nvidia/version: EIO" in (
        node.summary
    )
    assert "in use by ? (4242)" in gpu.summary


def test_gpu_count_says_when_the_drivers_gpus_cannot_be_listed() -> None:
    facts = literal_facts(
        NvidiaDriver("570.124.06", None, gpus_error="/proc/driver/nvidia/gpus: EACCES"),
        GpuProcessNames(),
    )
    facts = NodeFacts(facts.taken_at, {**facts.parts, "pci_gpus": []})
    results = list(check_gpu_count(CheckContext(facts=facts)))
    assert results[0] == Result(
        Status.ERROR, NODE, "cannot list the driver's GPUs: /proc/driver/nvidia/gpus: EACCES"
    )
