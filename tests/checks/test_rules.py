"""The rules checks and tuning share (checks/rules/), each on a literal facts object: a
Setting built here, an NcclFacts written out, GID tables as a capture would hold them."""

from __future__ import annotations

import pytest

from nodecheck.checks.node.facts import Unread
from nodecheck.checks.node.nccl_library import NcclLibraries, NcclLibrary
from nodecheck.checks.node.net import PortGidTypes
from nodecheck.checks.node.variables import CALLING_ENVIRONMENT, Setting, Source, Variables
from nodecheck.checks.result import Status
from nodecheck.checks.rules.allocator_settings import (
    both_names_disagree,
    expandable_segments_advice,
    judge_alloc_setting,
)
from nodecheck.checks.rules.gpu_peaks import achievable_tflops, allreduce_floor
from nodecheck.checks.rules.job_versions import UNKNOWN_TORCH
from nodecheck.checks.rules.nccl_settings import (
    NcclFacts,
    gid_discovery_results,
    gid_index_findings,
    judge_setting,
    selected_names,
)
from nodecheck.checks.rules.variable_judges import (
    NCCL_ENV,
    TORCH_ALLOC,
    VariableFacts,
    allocator_judge,
    judge_variable,
    judging_check,
    nccl_judge,
)

# Two GPUs on an NVSwitch, one InfiniBand HCA (port 1 active, port 2 down), one RoCE NIC.
EIGHT_RAIL = NcclFacts(
    gpu_count=2,
    nvswitch=True,
    rdma_active=("mlx5_0", "mlx5_1"),
    rdma_all=("mlx5_0", "mlx5_1"),
    rdma_ports={"mlx5_0": {1: "ACTIVE", 2: "DOWN"}, "mlx5_1": {1: "ACTIVE"}},
    interfaces={"ibp1s0": "up", "eth0": "up", "docker0": "down"},
    roce_ports=(("mlx5_1", 1),),
)
ONE_GPU = NcclFacts(1, False, (), (), {}, {"eth0": "up"})
ROCE_TABLE = PortGidTypes("mlx5_1", 1, {0: "IB/RoCE v1", 1: "RoCE v2", 3: "RoCE v2"})


def env(name: str, value: str) -> Setting:
    return Setting(name, value, CALLING_ENVIRONMENT)


@pytest.mark.parametrize(
    ("name", "value", "facts", "expected"),
    [
        ("NCCL_P2P_DISABLE", "1", EIGHT_RAIL, [(Status.FAIL, "between the 2 GPUs")]),
        ("NCCL_P2P_DISABLE", "1", ONE_GPU, [(Status.WARN, "no effect with one GPU")]),
        ("NCCL_P2P_DISABLE", "0", EIGHT_RAIL, []),
        ("NCCL_IB_DISABLE", "1", EIGHT_RAIL, [(Status.FAIL, "mlx5_0, mlx5_1 are active")]),
        ("NCCL_IB_DISABLE", "1", ONE_GPU, []),
        ("NCCL_NVLS_ENABLE", "0", EIGHT_RAIL, [(Status.WARN, "NVLink SHARP")]),
        ("NCCL_NVLS_ENABLE", "0", ONE_GPU, []),
        ("NCCL_IB_HCA", "=mlx5_0:2", EIGHT_RAIL, [(Status.FAIL, "mlx5_0 port 2 is DOWN")]),
        ("NCCL_IB_HCA", "=mlx5_0:1", EIGHT_RAIL, []),
        ("NCCL_SOCKET_IFNAME", "docker", EIGHT_RAIL, [(Status.FAIL, "down: docker0")]),
        ("NCCL_SOCKET_IFNAME", "wlan", EIGHT_RAIL, [(Status.FAIL, "ibp1s0, eth0, docker0")]),
        ("NCCL_NET_GDR_LEVEL", "LOC", EIGHT_RAIL, [(Status.FAIL, "GPUDirect RDMA disabled")]),
        ("NCCL_NET_GDR_LEVEL", "LOC", ONE_GPU, []),
        (" NCCL_ALGO", "Ring", EIGHT_RAIL, [(Status.WARN, "remove the spaces around '='")]),
        (
            "NCCL_MAX_NRINGS",
            "4 ",
            EIGHT_RAIL,
            [(Status.WARN, "surrounding whitespace"), (Status.WARN, "removed in NCCL 2.5")],
        ),
    ],
)
def test_nccl_rule_on_literal_facts(
    name: str, value: str, facts: NcclFacts, expected: list[tuple[Status, str]]
) -> None:
    findings = judge_setting(env(name, value), facts)
    assert len(findings) == len(expected), findings
    for finding, (status, words) in zip(findings, expected, strict=True):
        assert finding.status is status and words in finding.reason, finding


def test_selector_on_literal_names() -> None:
    names = ["mlx5_1", "mlx5_10", "eth0"]
    assert selected_names("mlx5_1", names) == ["mlx5_1", "mlx5_10"]
    assert selected_names("=mlx5_1", names) == ["mlx5_1"]
    assert selected_names("^mlx5", names) == ["eth0"]


@pytest.mark.parametrize(
    ("value", "tables", "expected"),
    [
        ("1", [ROCE_TABLE], []),
        ("0", [ROCE_TABLE], [(Status.WARN, "mlx5_1 port 1: IB/RoCE v1")]),
        ("2", [ROCE_TABLE], [(Status.WARN, "mlx5_1 port 1: no such GID")]),
        ("-1", [ROCE_TABLE], []),
        ("x", [ROCE_TABLE], [(Status.WARN, "not a number")]),
        (
            "3",
            [PortGidTypes("mlx5_1", 1, problems={3: "/sys/.../types/3: input/output error"})],
            [(Status.ERROR, "mlx5_1 port 1: /sys/.../types/3: input/output error")],
        ),
        (
            "3",
            [PortGidTypes("mlx5_1", 1, problem="/sys/.../types: permission denied")],
            [(Status.ERROR, "cannot tell whether GID index 3 is RoCE v2 on mlx5_1 port 1")],
        ),
        (
            "3",
            Unread("reading roce_gids did not finish within 20 s", "timeout"),
            [(Status.ERROR, "did not finish within 20 s")],
        ),
    ],
)
def test_gid_index_rule_on_literal_tables(
    value: str, tables: list[PortGidTypes] | Unread, expected: list[tuple[Status, str]]
) -> None:
    findings = gid_index_findings(env("NCCL_IB_GID_INDEX", value), EIGHT_RAIL, tables)
    assert len(findings) == len(expected), findings
    for finding, (status, words) in zip(findings, expected, strict=True):
        assert finding.status is status and words in finding.reason, finding


def test_gid_index_matters_only_with_roce_ports() -> None:
    """No RoCE port: nothing uses a GID index, so nothing to tell (even unread tables)."""
    unread = Unread("the capture holds no roce_gids", "not captured")
    assert gid_index_findings(env("NCCL_IB_GID_INDEX", "3"), ONE_GPU, unread) == []


@pytest.mark.parametrize(
    ("name", "value", "status", "words"),
    [
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segment:True", Status.FAIL, "unknown option"),
        ("PYTORCH_ALLOC_CONF", "max_split_size_mb:10", Status.FAIL, "at least 20"),
        (
            "PYTORCH_CUDA_ALLOC_CONF",
            "backend:cudaMallocAsync,max_split_size_mb:64",
            Status.WARN,
            "ignores max_split_size_mb",
        ),
        ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", Status.WARN, "turns off the caching allocator"),
    ],
)
def test_allocator_rule_on_literal_settings(
    name: str, value: str, status: Status, words: str
) -> None:
    (finding,) = judge_alloc_setting(env(name, value))
    assert finding.status is status and words in finding.reason


def test_allocator_names_disagreeing_in_one_source() -> None:
    job = Source("process", "pid 7 (python3)")
    settings = [
        Setting("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", job),
        Setting("PYTORCH_ALLOC_CONF", "expandable_segments:False", job),
        Setting("PYTORCH_ALLOC_CONF", "expandable_segments:False", CALLING_ENVIRONMENT),
    ]
    (warning,) = both_names_disagree(settings)
    assert warning.status is Status.WARN and warning.summary.startswith("pid 7 (python3) sets")


def test_expandable_segments_advice_reads_only_the_calling_environment() -> None:
    job = Source("process", "pid 7 (python3)")
    on = [env("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments : True")]
    assert expandable_segments_advice(on) == (
        "expandable segments are on in the calling environment",
        "",
    )
    text, remedy = expandable_segments_advice(
        [Setting("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", job)]
    )
    assert text == "no allocator configuration in the calling environment"
    assert remedy.startswith("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def test_gid_discovery_on_literal_libraries() -> None:
    old = NcclLibraries((NcclLibrary((2, 18, 3), "/usr/lib/libnccl.so.2.18.3"),), ())
    (warning,) = gid_discovery_results(old, EIGHT_RAIL, Variables())
    assert warning.status is Status.WARN and "uses GID index 0 on mlx5_1" in warning.summary
    told = Variables(settings=[env("NCCL_IB_GID_INDEX", "3")])
    assert gid_discovery_results(old, EIGHT_RAIL, told) == []
    new = NcclLibraries((NcclLibrary((2, 21, 5), "/usr/lib/libnccl.so.2.21.5"),), ())
    assert gid_discovery_results(new, EIGHT_RAIL, Variables()) == []
    assert gid_discovery_results(old, ONE_GPU, Variables()) == []


def test_peaks_on_literal_model_names() -> None:
    assert achievable_tflops("NVIDIA H100 80GB HBM3", "bf16") == 794.5
    assert achievable_tflops("NVIDIA H100 PCIe", "bf16") is None
    assert allreduce_floor("NVIDIA H200", 8) == 482.3
    assert allreduce_floor("NVIDIA H200", 4) is None


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("PYTORCH_CUDA_ALLOC_CONF", TORCH_ALLOC),
        (" PYTORCH_ALLOC_CONF", TORCH_ALLOC),
        ("PYTORCH_NO_CUDA_MEMORY_CACHING", TORCH_ALLOC),
        ("NCCL_DEBUG", NCCL_ENV),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", NCCL_ENV),
        ("CUDA_LAUNCH_BLOCKING", NCCL_ENV),
    ],
)
def test_dispatch_gives_each_variable_one_judge(name: str, check: str) -> None:
    """A variable goes to exactly one check's judge; the other judges say nothing of it."""
    facts = VariableFacts(EIGHT_RAIL, [ROCE_TABLE])
    assert judging_check(name) == check
    flagged = {
        "PYTORCH_CUDA_ALLOC_CONF": "bogus:1",
        " PYTORCH_ALLOC_CONF": "bogus:1",
        "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
        "NCCL_DEBUG": "INFO",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
        "CUDA_LAUNCH_BLOCKING": "1",
    }[name]
    setting = env(name, flagged)
    by_check = {
        TORCH_ALLOC: allocator_judge(UNKNOWN_TORCH)(setting),
        NCCL_ENV: nccl_judge(facts)(setting),
    }
    assert by_check[check] != []
    assert [f for c, found in by_check.items() if c != check for f in found] == []
    assert judge_variable(setting, facts) == (check, by_check[check])


def test_dispatch_judges_the_gid_index_against_the_tables() -> None:
    setting = env("NCCL_IB_GID_INDEX", "0")
    (finding,) = nccl_judge(VariableFacts(EIGHT_RAIL, [ROCE_TABLE]))(setting)
    assert finding.status is Status.WARN and "IB/RoCE v1" in finding.reason
    # Tables left unread (nothing named a GID index when the facts were gathered): an
    # error, never a pass.
    (unknown,) = nccl_judge(VariableFacts(EIGHT_RAIL))(setting)
    assert unknown.status is Status.ERROR
