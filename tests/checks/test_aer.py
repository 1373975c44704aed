"""PCIe AER: the sysfs counters and the kernel log's groups, read on literal text and on
replicas, and judged per GPU and RDMA NIC path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodecheck.checks.context import CheckContext
from nodecheck.checks.host.pcie_aer import (
    CORRECTED_REMEDY,
    UNCORRECTABLE_REMEDY,
    check_pcie_aer,
)
from nodecheck.checks.node.aer import (
    AerCounts,
    AerEvent,
    AerHistory,
    AerReading,
    DeviceAer,
    parse_aer_counts,
    parse_aer_events,
    read_device_aer,
    status_errors,
)
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.kernel_log_facts import KernelLogFacts
from nodecheck.checks.result import Action, FaultClass, Result, Status
from tests.checks.literal_facts import (
    GPU,
    GPU_PORT,
    NIC,
    NIC_PORT,
    ROOT_PORT,
    TAKEN_AT,
    UPSTREAM_PORT,
    context,
    inventory,
)
from tests.fixtures.nodegen import build_node
from tests.fixtures.nodes import dgx_h100

BOOT = TAKEN_AT - 86_400.0

# aer_dev_correctable as drivers/pci/pcie/aer.c prints it (short names), and as the ABI
# document's sample shows it (long names, "RELAY_NUM").
KERNEL_CORRECTABLE = (
    "RxErr 2\nBadTLP 0\nBadDLLP 1\nRollover 0\nTimeout 3\nNonFatalErr 0\nCorrIntErr 0\n"
    "HeaderOF 0\nTOTAL_ERR_COR 5\n"
)
ABI_CORRECTABLE = (
    "Receiver Error 2\nBad TLP 0\nBad DLLP 1\nRELAY_NUM Rollover 0\nReplay Timer Timeout 3\n"
    "Advisory Non-Fatal 0\nCorrected Internal Error 0\nHeader Log Overflow 0\nTOTAL_ERR_COR 5\n"
)


@pytest.mark.parametrize("text", [KERNEL_CORRECTABLE, ABI_CORRECTABLE])
def test_a_correctable_file_in_either_wording(text: str) -> None:
    counts = parse_aer_counts(text)
    assert counts.total == 5
    assert counts.by_error["RxErr"] == 2 and counts.by_error["Timeout"] == 3
    assert counts.by_error["BadDLLP"] == 1 and "Rollover" not in counts.by_error  # at 0


def test_a_file_without_its_total_sums_its_errors() -> None:
    reading = DeviceAer(GPU, 0.0, {"fatal": parse_aer_counts("SDES 1\nDLP 2\n")})
    assert reading.total("fatal") == 3 and reading.total("nonfatal") is None


@pytest.mark.parametrize("text", ["RxErr two\n", "RxErr\n", "12\n", "RxErr " + "9" * 30 + "\n"])
def test_a_line_that_is_no_count_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="count"):
        parse_aer_counts(text)


def test_reading_a_device_keeps_what_it_could(tmp_path: Path) -> None:
    (tmp_path / "aer_dev_correctable").write_text(KERNEL_CORRECTABLE)
    (tmp_path / "aer_dev_fatal").write_text("SDES x\n")
    os.mkfifo(tmp_path / "aer_dev_nonfatal")
    (tmp_path / "aer_rootport_total_err_cor").write_text("7\n")
    reading = read_device_aer(ROOT_PORT, str(tmp_path))
    assert reading.total("correctable") == 5 and reading.received == {"correctable": 7}
    assert set(reading.problems) == {"aer_dev_fatal", "aer_dev_nonfatal"}
    assert "FIFO" in reading.problems["aer_dev_nonfatal"]


def test_a_device_without_aer_has_no_counts(tmp_path: Path) -> None:
    reading = read_device_aer(GPU, str(tmp_path))
    assert reading.counts == {} and reading.problems == {}


def test_status_words_name_their_unmasked_bits() -> None:
    assert status_errors(0x00001041, 0x00000001, "correctable") == ("BadTLP", "Timeout")
    assert status_errors(0x00000020, 0, "fatal") == ("SDES",)
    assert status_errors(0x00000200, 0, "nonfatal") == ("bit 9",)


# Groups as each kernel generation words them (drivers/pci/pcie/aer.c over the years):
# 4.x "received: id=", then the group; 5.x "AER: " on every line; 6.x "error message
# received from"; a group whose "[bit] name" lines were lost; kmsg and syslog envelopes.
LOG = "\n".join(
    [
        "[  100.000001] pcieport 0000:00:01.0: AER: Corrected error received: id=0008",
        "[  100.000002] pcieport 0000:00:01.0: PCIe Bus Error: severity=Corrected, "
        "type=Physical Layer, id=0008(Receiver ID)",
        "[  100.000003] pcieport 0000:00:01.0:   device [8086:352a] "
        "error status/mask=00000001/00002000",
        "[  100.000004] pcieport 0000:00:01.0:    [ 0] Receiver Error",
        "[  200.000000] pcieport 0000:00:01.0: AER: Multiple Corrected error received: "
        "0000:03:00.0",
        "[  200.000001] nvidia 0000:03:00.0: AER: PCIe Bus Error: severity=Corrected, "
        "type=Data Link Layer, (Transmitter ID)",
        "[  200.000002] nvidia 0000:03:00.0: AER:   device [10de:2330] "
        "error status/mask=00001000/0000e000",
        "[  200.000003] nvidia 0000:03:00.0: AER:    [12] Timeout                (First)",
        "[  300.000000] pcieport 0000:00:01.0: AER: Uncorrectable (Non-Fatal) "
        "error message received from 0000:04:00.0",
        "[  300.000001] mlx5_core 0000:04:00.0: PCIe Bus Error: "
        "severity=Uncorrectable (Non-Fatal), type=Transaction Layer, (Requester ID)",
        "[  300.000002] mlx5_core 0000:04:00.0:   device [15b3:1021] "
        "error status/mask=00004000/00000000",
        "[  400.000000] some other driver: an unrelated line",
        "6,900,500000000,-;pcieport 0000:02:00.0: PCIe Bus Error: "
        "severity=Uncorrected (Fatal), type=Data Link Layer, (Receiver ID)",
        "6,901,500000001,-;pcieport 0000:02:00.0:    [ 5] Surprise Down Error    (First)",
    ]
)


def test_the_log_groups_of_every_kernel_generation() -> None:
    events = parse_aer_events(LOG, BOOT, TAKEN_AT)
    shown = [(e.bdf, e.kind, e.layer, e.errors, e.reported_by) for e in events]
    assert shown == [
        (ROOT_PORT, "correctable", "Physical Layer", ("RxErr",), ROOT_PORT),
        (GPU, "correctable", "Data Link Layer", ("Timeout",), ROOT_PORT),
        # its "[bit]" line lost: the status word names Completion Timeout
        (NIC, "nonfatal", "Transaction Layer", ("CmpltTO",), ROOT_PORT),
        # announced by no "received" line of its moment
        (GPU_PORT, "fatal", "Data Link Layer", ("SDES",), ""),
    ]
    assert [e.at for e in events] == [
        BOOT + 100.000002,
        BOOT + 200.000001,
        BOOT + 300.000001,
        BOOT + 500.0,
    ]


def test_a_group_of_megabytes_is_cut() -> None:
    line = (
        "[ 1.0] nvidia 0000:03:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
        + "x" * 5_000_000
    )
    [event] = parse_aer_events(line, BOOT, TAKEN_AT)
    assert len(event.message) < 1000 and event.kind == "correctable"


def test_no_aer_line_no_event() -> None:
    text = "[ 1.0] NVRM: Xid (PCI:0000:03:00): 79, GPU has fallen off the bus.\n[ 2.0] ] [ 5] x\n"
    assert parse_aer_events(text, BOOT, TAKEN_AT) == []


# --- judging, on literal facts -------------------------------------------------------

CLEAN = {"correctable": 0, "nonfatal": 0, "fatal": 0}


def device(bdf: str, at: float = TAKEN_AT, **totals: int) -> DeviceAer:
    counts = {kind: AerCounts({}, {**CLEAN, **totals}[kind]) for kind in CLEAN}
    return DeviceAer(bdf, at, counts)


def reading(at: float = TAKEN_AT, **planted: dict[str, int]) -> AerReading:
    """Every device of the literal node's paths at 0, but those `planted` (keyed by a
    name of literal_facts: ROOT_PORT, GPU_PORT, ...)."""
    names = {"ROOT_PORT": ROOT_PORT, "UPSTREAM_PORT": UPSTREAM_PORT, "GPU_PORT": GPU_PORT}
    names |= {"NIC_PORT": NIC_PORT, "GPU": GPU, "NIC": NIC}
    return AerReading(
        [device(bdf, at, **planted.get(name, {})) for name, bdf in sorted(names.items())]
    )


def judge(
    aer: AerReading, events: tuple[AerEvent, ...] = (), history: AerHistory | None = None
) -> dict[str, Result]:
    log = KernelLogFacts("/dev/kmsg", BOOT, aer=events)
    parts = {"inventory": inventory(), "pcie_aer": aer, "kernel_log": log}
    ctx: CheckContext = context(parts, aer_history=history or AerHistory())
    return {result.subject: result for result in check_pcie_aer(ctx)}


def test_a_clean_node_passes_with_its_counters_exported() -> None:
    results = judge(reading())
    assert set(results) == {f"gpu {GPU}", "nic mlx5_0"}
    assert all(r.status is Status.OK for r in results.values())
    names = {s.metric.name for s in results[f"gpu {GPU}"].samples}
    assert names == {"nodecheck_pcie_aer_errors_total"}
    assert len(results[f"gpu {GPU}"].samples) == 4 * 3  # root, upstream, port, GPU: 3 kinds


def test_a_fatal_error_at_the_root_port_fails_everything_below_it() -> None:
    results = judge(reading(ROOT_PORT={"fatal": 1}))
    for subject in (f"gpu {GPU}", "nic mlx5_0"):
        result = results[subject]
        assert result.status is Status.FAIL and result.action is Action.REBOOT, result
        assert f"1 at its root port {ROOT_PORT}" in result.summary
        assert result.remedy == UNCORRECTABLE_REMEDY
        assert result.fault_class is None  # the check's own: gpu-hardware


def test_a_nonfatal_error_at_one_switch_port_fails_only_the_device_below() -> None:
    results = judge(reading(NIC_PORT={"nonfatal": 2}))
    assert results[f"gpu {GPU}"].status is Status.OK
    nic = results["nic mlx5_0"]
    assert nic.status is Status.FAIL and "non-fatal" in nic.summary
    assert f"2 at the switch port {NIC_PORT} above it" in nic.summary


def test_corrected_errors_warn_by_their_rate_between_two_readings() -> None:
    history = AerHistory()
    judge(reading(TAKEN_AT - 120), history=history)
    # 10 more in 2 minutes: 5 a minute, within the limit of 8.
    calm = judge(reading(GPU_PORT={"correctable": 10}), history=history)
    assert calm[f"gpu {GPU}"].status is Status.OK
    assert calm[f"gpu {GPU}"].details["corrected_per_minute"] == pytest.approx(5.0)
    # then 60 more over 2 minutes at the GPU and its port: 30 a minute
    later = reading(TAKEN_AT + 120, GPU_PORT={"correctable": 40}, GPU={"correctable": 30})
    results = judge(later, history=history)
    gpu = results[f"gpu {GPU}"]
    assert gpu.status is Status.WARN and gpu.remedy == CORRECTED_REMEDY, gpu
    assert gpu.action is Action.INSPECT_HARDWARE
    assert gpu.fault_class is FaultClass.GPU_PERFORMANCE
    assert "30 corrected PCIe errors a minute over the 120 s" in gpu.summary
    assert results["nic mlx5_0"].status is Status.OK


def test_a_burst_read_seconds_apart_is_no_rate() -> None:
    history = AerHistory()
    judge(reading(TAKEN_AT - 5), history=history)
    results = judge(reading(GPU={"correctable": 7}), history=history)
    assert results[f"gpu {GPU}"].status is Status.OK  # 7 over at least a minute


def test_corrected_counts_since_boot_alone_are_no_rate() -> None:
    results = judge(reading(GPU={"correctable": 5000}))
    assert results[f"gpu {GPU}"].status is Status.OK
    since_boot = results[f"gpu {GPU}"].details["since_boot"]
    assert isinstance(since_boot, dict) and since_boot[GPU]["correctable"] == 5000


def corrected(bdf: str, ago: float) -> AerEvent:
    return AerEvent(bdf, "correctable", "Physical Layer", ("RxErr",), TAKEN_AT - ago, "x")


def test_one_shot_takes_the_rate_from_the_log_of_the_last_ten_minutes() -> None:
    burst = tuple(corrected(GPU_PORT, 30 + i) for i in range(90))  # 90 in 10 minutes
    old = tuple(corrected(GPU_PORT, 3600 + i) for i in range(500))  # an hour ago
    results = judge(reading(), burst + old)
    gpu = results[f"gpu {GPU}"]
    assert gpu.status is Status.WARN and "in the kernel log's last 10 minutes" in gpu.summary
    assert judge(reading(), old)[f"gpu {GPU}"].status is Status.OK


def test_an_uncorrectable_group_in_the_log_fails_even_without_counters() -> None:
    fatal = AerEvent(GPU_PORT, "fatal", "Data Link Layer", ("SDES",), TAKEN_AT - 600, "x")
    before_boot = AerEvent(NIC_PORT, "fatal", "Data Link Layer", ("SDES",), BOOT - 60, "x")
    results = judge(AerReading([]), (fatal, before_boot))
    gpu = results[f"gpu {GPU}"]
    assert gpu.status is Status.FAIL and "10 min ago at 0000:02:00.0 (SDES)" in gpu.summary
    # the NIC's was before this boot: cleared by it, and no counters to judge
    assert results["nic mlx5_0"].status is Status.SKIP


def test_an_unreadable_counter_is_an_error_never_a_pass() -> None:
    broken = reading()
    broken.devices[0] = DeviceAer(GPU, TAKEN_AT, problems={"aer_dev_fatal": "I/O error"})
    result = judge(broken)[f"gpu {GPU}"]
    assert result.status is Status.ERROR and "I/O error" in result.summary


def test_no_counters_anywhere_is_one_skip_saying_so() -> None:
    results = judge(AerReading([DeviceAer(GPU, TAKEN_AT)]))
    assert list(results) == ["node"]
    assert results["node"].status is Status.SKIP and "not watched" in results["node"].summary


# --- on replicas: each kind planted ----------------------------------------------------


@pytest.mark.parametrize(
    ("planted", "status", "failing"),
    [
        # a Surprise Down at GPU 7's switch port: that GPU only
        ({"0000:b9:02.0": {"fatal:SDES": 1}}, Status.FAIL, {"gpu 0000:bc:00.0"}),
        # a Completion Timeout seen by a NIC itself
        ({"0000:3b:00.0": {"nonfatal:CmpltTO": 1}}, Status.FAIL, {"nic mlx5_2"}),
        # a poisoned TLP at a root port: its two GPUs and two NICs
        (
            {"0000:15:01.0": {"nonfatal:TLP": 3}},
            Status.FAIL,
            {"gpu 0000:18:00.0", "gpu 0000:1a:00.0", "nic mlx5_0", "nic mlx5_1"},
        ),
        # corrected errors since boot alone: exported, judged by their rate only
        ({"0000:17:00.0": {"correctable:RxErr": 500}}, Status.OK, set()),
    ],
)
def test_each_kind_planted_on_the_dgx_replica(
    tmp_path: Path, planted: dict[str, dict[str, int]], status: Status, failing: set[str]
) -> None:
    spec = dgx_h100()
    for bdf, counts in planted.items():
        spec.find_device(bdf).aer = counts
    root = build_node(spec, tmp_path)
    ctx = CheckContext(fs=_fs(root))
    results = list(check_pcie_aer(ctx))
    assert len(results) == 17  # 8 GPUs, 8 compute NICs and the RoCE NIC
    assert {r.subject for r in results if r.status is Status.FAIL} == failing
    assert max(r.status.severity for r in results) == status.severity
    totals = {(s.labels["bus_id"], s.labels["kind"]): s.value for r in results for s in r.samples}
    for bdf, counts in planted.items():
        for key, count in counts.items():
            assert totals[(bdf, key.split(":")[0])] == count


def test_the_replicas_root_ports_count_what_is_below_them(tmp_path: Path) -> None:
    spec = dgx_h100()
    spec.find_device("0000:19:00.0").aer = {"correctable:RxErr": 4}
    spec.find_device("0000:1a:00.0").aer = {"fatal:MalfTLP": 1}
    root = build_node(spec, tmp_path)
    port = root / "sys/bus/pci/devices/0000:15:01.0"
    assert (port / "aer_rootport_total_err_cor").read_text() == "4\n"
    assert (port / "aer_rootport_total_err_fatal").read_text() == "1\n"
    reading = read_device_aer("0000:15:01.0", str(port.resolve()))
    assert reading.received == {"correctable": 4, "nonfatal": 0, "fatal": 1}


def _fs(root: Path) -> NodeFS:
    return NodeFS(sysfs=root / "sys", procfs=root / "proc", rootfs=root)


def counted(bdf: str, kind: str, at: float = TAKEN_AT, **by_error: int) -> DeviceAer:
    """A device whose `kind` file names `by_error`, the other kinds at 0."""
    counts = {k: AerCounts({}, 0) for k in CLEAN}
    counts[kind] = AerCounts(dict(by_error), sum(by_error.values()))
    return DeviceAer(bdf, at, counts)


def test_refused_requests_alone_warn_and_a_hardware_error_beside_them_fails() -> None:
    refused = AerReading([counted(NIC, "nonfatal", UnsupReq=3, ACSViol=1)])
    nic = judge(refused)["nic mlx5_0"]
    assert nic.status is Status.WARN and nic.action is Action.INVESTIGATE, nic
    assert "each a request refused or blocked" in nic.summary
    timeout = AerReading([counted(NIC, "nonfatal", UnsupReq=3, CmpltTO=1)])
    assert judge(timeout)["nic mlx5_0"].status is Status.FAIL
    # fatal is fatal, whatever it names
    fatal = AerReading([counted(NIC, "fatal", UnsupReq=1)])
    assert judge(fatal)["nic mlx5_0"].status is Status.FAIL
    # the log's group names its errors likewise
    event = AerEvent(NIC, "nonfatal", "Transaction Layer", ("UnsupReq",), TAKEN_AT - 60, "x")
    assert judge(AerReading([]), (event,))["nic mlx5_0"].status is Status.WARN


def test_only_the_link_errors_make_the_corrected_rate() -> None:
    history = AerHistory()
    judge(AerReading([counted(GPU, "correctable", TAKEN_AT - 60)]), history=history)
    advisory = AerReading([counted(GPU, "correctable", NonFatalErr=500, HeaderOF=3)])
    assert judge(advisory, history=history)[f"gpu {GPU}"].status is Status.OK
    history = AerHistory()
    judge(AerReading([counted(GPU, "correctable", TAKEN_AT - 60)]), history=history)
    replays = AerReading([counted(GPU, "correctable", Timeout=20, BadDLLP=5, NonFatalErr=500)])
    gpu = judge(replays, history=history)[f"gpu {GPU}"]
    assert gpu.status is Status.WARN and "25 corrected PCIe errors a minute" in gpu.summary


def test_runs_seconds_apart_keep_the_baseline_until_it_is_a_minute_old() -> None:
    history = AerHistory()
    base = [counted(GPU, "correctable", TAKEN_AT, RxErr=0)]
    assert history.exchange(base) == {}
    # an XID runs the check again 5 s later: the baseline stays the first reading
    soon = [counted(GPU, "correctable", TAKEN_AT + 5, RxErr=3)]
    assert history.exchange(soon)[GPU].read_at == TAKEN_AT
    # 65 s after the first: rated against it, and this one becomes the baseline
    later = [counted(GPU, "correctable", TAKEN_AT + 65, RxErr=30)]
    assert history.exchange(later)[GPU].read_at == TAKEN_AT
    assert history.exchange([])[GPU].read_at == TAKEN_AT + 65


def test_a_line_of_blanks_is_read_at_once() -> None:
    """Two runs of optional blanks side by side would try every split of 100,000 blanks."""
    text = (
        "[ 1.0] nvidia 0000:03:00.0: PCIe Bus Error: severity=Corrected, type=Physical "
        "Layer, (Receiver ID)\n[ 1.0] nvidia 0000:03:00.0:    [ 0] RxErr" + " " * 100_000
    )
    [event] = parse_aer_events(text, BOOT, TAKEN_AT)
    assert event.errors == ("RxErr",)


def test_a_line_of_a_later_moment_joins_no_group() -> None:
    text = "\n".join(
        [
            "[ 10.0] nvidia 0000:03:00.0: PCIe Bus Error: severity=Corrected, "
            "type=Physical Layer, (Receiver ID)",
            "[ 10.0] nvidia 0000:03:00.0:    [ 0] RxErr",
            "[ 900.0] nvidia 0000:03:00.0:    [12] Timeout",
            "[ 901.0] nvidia 0000:03:00.0:    [ 6] BadTLP",
        ]
    )
    [event] = parse_aer_events(text, BOOT, TAKEN_AT)
    assert event.errors == ("RxErr",)
