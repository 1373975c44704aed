"""The NCCL/CUDA/torch variable rules, on the 8-GPU node's facts, and where findings come from."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.variables import CALLING_ENVIRONMENT, Setting
from nodecheck.checks.result import Status
from nodecheck.checks.rules.nccl_settings import NcclFacts, judge_setting, nccl_facts
from tests.conftest import Node, by_status


@pytest.fixture(scope="module")
def facts(dgx: Node) -> NcclFacts:
    return nccl_facts(read_inventory(dgx.fs))


RULE_CASES = [
    ("NCCL_P2P_DISABLE", "1", Status.FAIL, "peer-to-peer"),
    ("NCCL_P2P_LEVEL", "LOC", Status.FAIL, "peer-to-peer"),
    ("NCCL_P2P_LEVEL", "phb", Status.WARN, "case-sensitively"),
    ("NCCL_NET_GDR_LEVEL", "0", Status.FAIL, "GPUDirect RDMA disabled"),
    ("NCCL_NET_GDR_LEVEL", "sys", Status.WARN, "case-sensitively"),
    ("NCCL_IB_DISABLE", "1", Status.FAIL, "falls back to TCP"),
    ("NCCL_SHM_DISABLE", "1", Status.WARN, "shared-memory"),
    ("NCCL_NVLS_ENABLE", "0", Status.WARN, "NVLink SHARP"),
    ("NCCL_PROTO", "LL128", Status.FAIL, "corrupt"),
    ("NCCL_PROTO", "^LL128", Status.WARN, "restricts"),
    ("NCCL_ALGO", "Ring", Status.WARN, "forces the collective algorithm"),
    ("NCCL_DEBUG", "INFO", Status.WARN, "set WARN in production"),
    ("NCCL_DEBUG", "TRACE", Status.WARN, "unset, NCCL logs nothing"),
    ("NCCL_DEBUG_SUBSYS", "INIT,ALL", Status.WARN, "every NCCL subsystem"),
    ("NCCL_IB_TIMEOUT", "14", Status.WARN, "large fabrics"),
    ("NCCL_IB_HCA", "mlx5_9", Status.FAIL, "mlx5_9 does not exist"),
    ("NCCL_IB_HCA", "=mlx5_0:2", Status.FAIL, "mlx5_0 port 2 is missing"),
    ("NCCL_IB_HCA", "mlx5", Status.WARN, "prefix match"),
    ("NCCL_IB_HCA", "^mlx5", Status.FAIL, "excludes every RDMA device"),
    ("NCCL_SOCKET_IFNAME", "eth", Status.FAIL, "matches no network interface"),
    ("NCCL_SOCKET_IFNAME", "docker", Status.FAIL, "only interfaces that are down"),
    ("NCCL_LL_THRESHOLD", "0", Status.WARN, "removed in NCCL 2.5"),
    ("NCCL_ASYNC_ERROR_HANDLING", "1", Status.WARN, "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0", Status.WARN, "hangs the job"),
    ("CUDA_LAUNCH_BLOCKING", "1", Status.WARN, "synchronous"),
]


@pytest.mark.parametrize(("name", "value", "status", "words"), RULE_CASES)
def test_rule(facts: NcclFacts, name: str, value: str, status: Status, words: str) -> None:
    findings = judge_setting(Setting(name, value, CALLING_ENVIRONMENT), facts)
    assert any(f.status is status and words in f.reason for f in findings), findings


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NCCL_P2P_DISABLE", "0"),
        ("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1"),
        ("NCCL_IB_HCA", "^=mlx5_8"),
        ("NCCL_SOCKET_IFNAME", "ibp"),
        ("NCCL_SOCKET_IFNAME", "^docker,lo"),
        ("NCCL_IB_TIMEOUT", "22"),
        ("NCCL_DEBUG", "WARN"),
        ("NCCL_IB_QPS_PER_CONNECTION", "4"),
        ("NCCL_NET_GDR_LEVEL", "PHB"),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"),
        ("CUDA_VISIBLE_DEVICES", "0,1"),
    ],
)
def test_sound_settings_pass(facts: NcclFacts, name: str, value: str) -> None:
    assert judge_setting(Setting(name, value, CALLING_ENVIRONMENT), facts) == []


def test_p2p_disable_on_one_gpu_is_only_a_warning(workstation: Node) -> None:
    facts = nccl_facts(read_inventory(workstation.fs))
    findings = judge_setting(Setting("NCCL_P2P_DISABLE", "1", CALLING_ENVIRONMENT), facts)
    assert [f.status for f in findings] == [Status.WARN]


def test_conf_file_findings_name_file_and_line(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(dgx)
    (node.root / "etc/nccl.conf").write_text(
        "NCCL_IB_TIMEOUT=22\nNCCL_DEBUG = INFO\nNCCL_ALGO=Tree\n"
    )
    results = node.results("nccl_env")
    spaced = next(r for r in results if "nothing uses" in r.summary)
    assert spaced.status is Status.WARN and "/etc/nccl.conf line 2" in spaced.summary
    algo = next(r for r in results if r.summary.startswith("NCCL_ALGO=Tree"))
    assert algo.remedy == "remove line 3 (NCCL_ALGO) from /etc/nccl.conf"


def test_debug_info_is_changed_to_warn_never_removed(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """Unset, NCCL logs nothing (NVIDIA/nccl src/debug.cc), so the remedy for INFO is WARN,
    wherever it was found: the file's line, the calling environment, a job's launch."""
    node = copy_node(dgx)
    (node.root / "etc/nccl.conf").write_text("NCCL_IB_TIMEOUT=22\nNCCL_DEBUG=INFO\n")
    environ = node.root / "proc" / "5151" / "environ"
    environ.write_bytes(environ.read_bytes() + b"NCCL_DEBUG=INFO\0")
    results = node.results("nccl_env", environ={"NCCL_DEBUG": "INFO"})
    (debug,) = [r for r in results if r.summary.startswith("NCCL_DEBUG=INFO")]
    assert debug.status is Status.WARN and "set WARN in production" in debug.summary
    assert sorted(debug.remedy.split("; ")) == [
        "change line 2 of /etc/nccl.conf to NCCL_DEBUG=WARN",
        "export NCCL_DEBUG=WARN",
        "set NCCL_DEBUG=WARN in the launch environment of pid 5151 (python3)",
    ]
    assert "unset" not in debug.remedy and "remove" not in debug.remedy


def test_users_conf_file_is_read_through_passwd(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    node = copy_node(dgx)
    home = node.root / "home/alice"
    home.mkdir(parents=True)
    (home / ".nccl.conf").write_text("NCCL_SHM_DISABLE=1\n")
    # uid 1000 is alice in the node's /etc/passwd; her job (pid 5151) reads the same file.
    results = node.results("nccl_env")
    (finding,) = by_status(results, Status.WARN)
    assert "/home/alice/.nccl.conf line 1" in finding.summary


def test_gid_index_must_be_roce_v2(dgx: Node) -> None:
    good = dgx.results("nccl_env", environ={"NCCL_IB_GID_INDEX": "3"})
    assert by_status(good, Status.WARN, Status.FAIL) == []
    bad = dgx.results("nccl_env", environ={"NCCL_IB_GID_INDEX": "2"})
    (finding,) = by_status(bad, Status.WARN)
    assert "mlx5_8 port 1: IB/RoCE v1" in finding.summary


def test_same_finding_in_many_processes_is_one_result(dgx: Node) -> None:
    environ = {"NCCL_P2P_DISABLE": "1"}
    results = dgx.results("nccl_env", environ=environ)
    (finding,) = by_status(results, Status.FAIL)
    assert finding.details["found_in"] == ["the calling environment"]
    assert finding.remedy == "unset NCCL_P2P_DISABLE"


def test_allocator_names_disagreeing(dgx: Node) -> None:
    environ = {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_ALLOC_CONF": "expandable_segments:False",
    }
    results = dgx.results("torch_alloc", environ=environ)
    (warning,) = by_status(results, Status.WARN)
    assert "differently" in warning.summary
    (summary,) = by_status(results, Status.OK)
    assert "expandable segments are on" in summary.summary and summary.remedy == ""


def test_allocator_recommendation_when_absent(dgx: Node) -> None:
    (summary,) = dgx.results("torch_alloc")
    assert summary.status is Status.OK
    assert summary.remedy.startswith("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
