"""Faults of a capture (nodecheck.facts/v1) judged with --facts: values no node gives
(NaN, a temperature below absolute zero, a PCIe link at x0, a negative count), a key
given twice, a part left out or recorded as unread. Each is one line naming the file
and the place, with the exit status of its outcome, never judged and never an internal
error. Each test runs the real command as a subprocess on a capture of the faulty DGX
replica (its fake NVML: one planted fault per GPU, none on GPU 3)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodecheck.checks.node.facts import PARTS
from nodecheck.checks.registry import load_checks
from nodecheck.tuning.plan import PLAN_NEEDS, PLAN_OPTIONAL
from tests.agent.test_capture import NOWHERE, capture
from tests.agent.test_cli import run
from tests.conftest import Node
from tests.documents import untimed
from tests.faults.test_nvml import NONSENSE
from tests.fixtures.nvml_scenarios import dgx_faulty as faulty_scenario
from tests.fixtures.nvml_scenarios import modified

GPU3 = "parts.gpus.value.gpus[3]"
FIRST_GPU_DEVICE = "parts.inventory.value.pci['0000:18:00.0']"


@pytest.fixture(scope="module")
def faulty_capture(dgx_faulty: Node, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return capture(dgx_faulty, tmp_path_factory.mktemp("capture") / "dgx-faulty.json")


def gpu3(document: dict[str, Any]) -> dict[str, Any]:
    reading: dict[str, Any] = document["parts"]["gpus"]["value"]["gpus"][3]
    return reading


def first_gpu_device(document: dict[str, Any]) -> dict[str, Any]:
    device: dict[str, Any] = document["parts"]["inventory"]["value"]["pci"]["0000:18:00.0"]
    return device


def setting(
    where: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: object
) -> Callable[[dict[str, Any]], None]:
    return lambda document: where(document).__setitem__(key, value)


def memory_over_total(document: dict[str, Any]) -> None:
    gpu3(document)["memory_used"] = gpu3(document)["memory_total"] + 1


def redated(boot_time: float, xid_at: float | None = None) -> Callable[[dict[str, Any]], None]:
    """An edit that dates the capture at 1764600000 (2025-12-01), its boot at `boot_time`,
    its kernel log's events a minute before the capture and, where given, its second XID
    at `xid_at`."""

    def change(document: dict[str, Any]) -> None:
        document["taken_at"] = 1764600000.0
        log = document["parts"]["kernel_log"]["value"]
        log["boot_time"] = boot_time
        for event in (*log["xids"], *log["sxids"], *log.get("aer", [])):
            event["at"] = 1764600000.0 - 60  # a minute before the capture
        if xid_at is not None:
            log["xids"][1]["at"] = xid_at

    return change


# Each: an edit of the capture, and where and why the refusal says it is wrong. The JSON
# is written by Python's json, which writes math.nan and math.inf as the literals NaN and
# Infinity (no JSON has them; Python's json reads them unless told not to).
IMPOSSIBLE: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    (
        "power_limit_nan_string",
        setting(gpu3, "power_limit_w", "NaN"),
        f"{GPU3}.power_limit_w: NaN is not a number",
    ),
    (
        "power_limit_nan_literal",
        setting(gpu3, "power_limit_w", math.nan),
        f"{GPU3}.power_limit_w: NaN is not a number",
    ),
    (
        "power_infinity_literal",
        setting(gpu3, "power_w", math.inf),
        f"{GPU3}.power_w: Infinity is not a finite number",
    ),
    (
        "temperature_below_absolute_zero",
        setting(gpu3, "temperature_c", -300),
        f"{GPU3}.temperature_c: -300 °C is implausible (NVML answers 1 to 150 °C)",
    ),
    (
        "temperature_uint_max",
        setting(gpu3, "temperature_c", 4294967295),
        f"{GPU3}.temperature_c: 4294967295 °C is implausible (NVML answers 1 to 150 °C)",
    ),
    (
        "power_negative",
        setting(gpu3, "power_w", -5.0),
        f"{GPU3}.power_w: -5.0 W is implausible (NVML answers 0 to 5000 W)",
    ),
    (
        "power_limit_zero",
        setting(gpu3, "power_limit_w", 0.0),
        f"{GPU3}.power_limit_w: 0.0 W is implausible (NVML answers 1 to 5000 W)",
    ),
    (
        "utilization_above_100",
        setting(gpu3, "utilization_pct", 101),
        f"{GPU3}.utilization_pct: 101 % is implausible (NVML answers 0 to 100 %)",
    ),
    (
        "pcie_width_0",
        lambda d: gpu3(d)["pcie"].__setitem__("width", 0),
        f"{GPU3}.pcie.width: PCIe width 0 is implausible",
    ),
    (
        "pcie_gen_99",
        lambda d: gpu3(d)["pcie"].__setitem__("generation", 99),
        f"{GPU3}.pcie.generation: PCIe generation 99 is implausible",
    ),
    (
        "pcie_width_above_max",
        lambda d: gpu3(d)["pcie"].update(width=32, max_width=16),
        f"{GPU3}.pcie.width: PCIe width x32 above its maximum x16 is implausible",
    ),
    (
        "ecc_count_negative",
        lambda d: gpu3(d)["ecc"].__setitem__("aggregate_uncorrected", -1),
        f"{GPU3}.ecc.aggregate_uncorrected: -1 is negative: NVML counts in unsigned integers",
    ),
    (
        "replays_negative",
        setting(gpu3, "pcie_replays", -7),
        f"{GPU3}.pcie_replays: -7 is negative: NVML counts in unsigned integers",
    ),
    (
        "memory_used_above_total",
        memory_over_total,
        f"{GPU3}.memory_used: memory 85520809985 bytes used of 85520809984: implausible",
    ),
    (
        "sysfs_link_x64",
        lambda d: first_gpu_device(d)["link"].__setitem__("current_width", 64),
        f"{FIRST_GPU_DEVICE}.link.current_width: PCIe links are x1, x2, x4, x8, x12, x16, "
        "x32 wide, not x64",
    ),
    (
        "sysfs_link_speed_7",
        lambda d: first_gpu_device(d)["link"].__setitem__("max_speed", 7.0),
        f"{FIRST_GPU_DEVICE}.link.max_speed: no PCIe generation runs at 7 GT/s "
        "(2.5, 5, 8, 16, 32, 64, 128)",
    ),
    (
        "boot_after_the_capture",  # every XID would be "before the last boot", cleared
        redated(boot_time=1e300),
        "parts.kernel_log.value.boot_time: 1e+300 is after the capture's taken_at "
        "1764600000.0: a boot it cannot have seen",
    ),
    (
        "boot_before_1970",
        redated(boot_time=-1.0),
        "parts.kernel_log.value.boot_time: -1.0 is before 1970: no clock dates a boot so",
    ),
    (
        "xid_logged_a_day_after_the_capture",
        redated(boot_time=1764500000.0, xid_at=1764600000.0 + 86400),
        "parts.kernel_log.value.xids[1].at: 1764686400.0 is after the capture's taken_at "
        "1764600000.0: an event it cannot have seen",
    ),
    (
        "sysfs_numa_node_5000",
        setting(first_gpu_device, "numa_node", 5000),
        f"{FIRST_GPU_DEVICE}.numa_node: NUMA nodes are -1 to 1023, not 5000",
    ),
]


def edited(source: Path, path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    document = json.loads(source.read_text())
    change(document)
    path.write_text(json.dumps(document, indent=1))
    return path


def refused(path: Path, *command: str) -> str:
    """The one line `nodecheck COMMAND --facts PATH` refuses the capture with (exit 2)."""
    done = run(*NOWHERE, *command, "--facts", str(path))
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    prefix = f"nodecheck: --facts {path}: "
    assert done.stderr.startswith(prefix), done.stderr
    return done.stderr[len(prefix) : -1]


@pytest.mark.parametrize(
    ("change", "says"),
    [(change, says) for _, change, says in IMPOSSIBLE],
    ids=[name for name, _, _ in IMPOSSIBLE],
)
def test_a_value_no_node_gives_is_refused_naming_the_field(
    faulty_capture: Path, tmp_path: Path, change: Callable[[dict[str, Any]], None], says: str
) -> None:
    """NaN (the codec's string or JSON's missing literal), infinity, values outside what
    NVML answers (the live reading's own bounds: there such an answer is an error on that
    GPU, and the capture holds None), PCIe widths, speeds and NUMA nodes sysfs never
    shows, negative counts: `check` refuses the capture with exit 2 naming the field's
    path and why, never judges it (a NaN power limit was "state normal")."""
    path = edited(faulty_capture, tmp_path / "capture.json", change)
    assert refused(path, "check") == says


@pytest.mark.parametrize("command", [["inventory"], ["tune", "--format", "json"]])
def test_tune_and_inventory_refuse_an_impossible_value_too(
    faulty_capture: Path, tmp_path: Path, command: list[str]
) -> None:
    """The same loader for every command taking --facts."""
    path = edited(faulty_capture, tmp_path / "capture.json", setting(gpu3, "temperature_c", -300))
    assert refused(path, *command).startswith(f"{GPU3}.temperature_c: -300 °C is implausible")


# Each: where a key is given twice (a marker value, replaced in the JSON text by the
# original value, the key and the value again), and the object the refusal names.
TWICE: list[tuple[str, Callable[[dict[str, Any]], Any], str, str]] = [
    ("in_a_gpu_reading", gpu3, "power_limit_w", GPU3),
    ("in_a_mapping", lambda d: gpu3(d)["throttle_ns"], "hw_thermal", f"{GPU3}.throttle_ns"),
    ("in_a_part_entry", lambda d: d["parts"]["hostname"], "value", "parts['hostname']"),
    ("in_the_envelope", lambda d: d, "taken_at", ""),
]


@pytest.mark.parametrize(
    ("holder", "key", "where"),
    [(holder, key, where) for _, holder, key, where in TWICE],
    ids=[name for name, _, _, _ in TWICE],
)
def test_a_key_given_twice_is_refused_naming_its_object(
    faulty_capture: Path,
    tmp_path: Path,
    holder: Callable[[dict[str, Any]], Any],
    key: str,
    where: str,
) -> None:
    """`"power_limit_w": 700.0, "power_limit_w": 700.0`: JSON leaves which counts to the
    reader (Python's json took the last, silently); nodecheck takes neither: exit 2
    naming the object and the key."""
    document = json.loads(faulty_capture.read_text())
    value = json.dumps(holder(document)[key])
    holder(document)[key] = "@twice@"
    path = tmp_path / "capture.json"
    text = json.dumps(document, indent=1).replace('"@twice@"', f'{value}, "{key}": {value}')
    path.write_text(text)
    twice = f"key {key!r} is given twice (which value is meant cannot be told)"
    assert refused(path, "check") == (f"{where}: {twice}" if where else twice)


# What NVML itself answers that no GPU can mean is an error on that GPU, live: the
# reading keeps None and the answer in `errors`, so its capture is judged the same.
LIVE_NONSENSE = [
    case
    for case in NONSENSE
    if case[2].startswith(("NVML reported temperature -5", "NVML reported PCIe width"))
    or "power_limit 0.0" in case[2]
]


@pytest.mark.parametrize(
    ("check", "changes", "finding"),
    LIVE_NONSENSE,
    ids=[finding.split(":")[0].removeprefix("NVML reported ") for _, _, finding in LIVE_NONSENSE],
)
def test_nonsense_nvml_answered_is_the_same_gpu_error_in_its_capture(
    dgx_faulty: Node, tmp_path: Path, check: str, changes: dict[str, Any], finding: str
) -> None:
    """A guard that the refusals above are of edited captures only: GPU 3 answering a
    negative temperature, a 0 W limit or a PCIe width of 0 or above its maximum, captured
    and judged with --facts, is the live `error` on GPU 3, never a refusal."""
    node = dgx_faulty.with_scenario(
        modified(faulty_scenario(), gpu=3, **changes), tmp_path / "n.json"
    )
    path = capture(node, tmp_path / "capture.json")
    args = ["check", "--json", "--only", check]
    live = run(*node.cli_args, *args, env=node.env)
    judged = run(*NOWHERE, *args, "--facts", str(path))
    # 1 where another GPU's planted fault fails the check, 3 where GPU 3's error is all.
    assert judged.returncode == live.returncode in (1, 3), judged.stderr
    assert untimed(json.loads(judged.stdout)) == untimed(json.loads(live.stdout))
    [mine] = [r for r in json.loads(judged.stdout)["results"] if r["subject"] == "gpu 0000:3c:00.0"]
    assert mine["status"] == "error" and finding in mine["summary"], mine


CAPTURED_PARTS = [name for name, spec in PARTS.items() if spec.captured]
# What each command cannot do without; tune makes do without the parts of PLAN_OPTIONAL
# (the cpuset: a warning on every rank; the versions: both names of each renamed variable,
# and a note; MASTER_ADDR's interface and what the interconnect advice rests on: a note),
# as tuning/plan.py says, and reads the GPU identities only for a CUDA_VISIBLE_DEVICES
# naming GPUs by UUID (which this one does not).
NEEDED = {
    "tune": set(PLAN_NEEDS) - set(PLAN_OPTIONAL) - {"gpu_identities"},
    "inventory": {"inventory"},
}
DOING = {"tune": "plan the node", "inventory": "show the node"}
BROKEN = {"reason": "reading {part} failed: OSError: boom", "cause": "exception"}


@pytest.mark.parametrize("how", ["left_out", "unread"])
@pytest.mark.parametrize("part", CAPTURED_PARTS)
def test_a_capture_without_a_part_says_which_never_internal_error(
    faulty_capture: Path, tmp_path: Path, part: str, how: str
) -> None:
    """Each part of the capture left out, or recorded as unread: `tune` and `inventory`
    either do without it or exit 3 (could not determine) in one line naming the part and
    why; `check` judges every check (one needing the part says so). Never "internal
    error: PartUnavailableError", never a traceback."""
    document = json.loads(faulty_capture.read_text())
    if how == "left_out":
        del document["parts"][part]
        why = f"the capture holds no {part} (it was not captured)"
    else:
        reason = BROKEN["reason"].format(part=part)
        document["parts"][part] = {"unread": {"reason": reason, "cause": BROKEN["cause"]}}
        why = reason
    path = tmp_path / "capture.json"
    path.write_text(json.dumps(document))
    for command, flags in (("tune", ["--format", "json"]), ("inventory", ["--json"])):
        done = run(*NOWHERE, command, *flags, "--facts", str(path))
        assert "internal error" not in done.stderr and "Traceback" not in done.stderr
        if part in NEEDED[command]:
            assert (done.returncode, done.stdout) == (3, ""), (command, done.stderr)
            said = f"nodecheck: cannot {DOING[command]} without its {part} part: {why}\n"
            assert done.stderr == said
        else:
            assert (done.returncode, done.stderr) == (0, ""), (command, done.stderr)
            json.loads(done.stdout)
    judged = run(*NOWHERE, "check", "--json", "--facts", str(path))
    assert judged.returncode in (1, 3) and judged.stderr == "", judged.stderr
    assert {r["check"] for r in json.loads(judged.stdout)["results"]} == set(load_checks())


def test_a_uuid_in_a_captured_environment_is_placed_from_the_capture(
    faulty_capture: Path, tmp_path: Path
) -> None:
    """`tune --facts` maps a captured CUDA_VISIBLE_DEVICES naming GPU 5 by UUID through the
    captured gpu_identities; a capture without them cannot tell (no rank, said first),
    never every GPU."""
    document = json.loads(faulty_capture.read_text())
    calling = document["parts"]["calling_environment"]["value"]["values"]
    calling["CUDA_VISIBLE_DEVICES"] = "GPU-6f0c0005"
    path = tmp_path / "capture.json"
    path.write_text(json.dumps(document))
    done = run(*NOWHERE, "tune", "--format", "json", "--facts", str(path))
    assert done.returncode == 0, done.stderr
    [rank] = json.loads(done.stdout)["ranks"]
    assert (rank["gpu"], rank["numa_node"]) == ("0000:9c:00.0", 1)
    del document["parts"]["gpu_identities"]
    path.write_text(json.dumps(document))
    done = run(*NOWHERE, "tune", "--format", "json", "--facts", str(path))
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    assert planned["ranks"] == []
    assert planned["notes"][0] == (
        "nodecheck cannot tell which GPU CUDA_VISIBLE_DEVICES entry 1 ('GPU-6f0c0005') names: the "
        "nvidia driver's GPU list could not be read (the capture holds no gpu_identities (it was "
        "not captured)): CUDA may see a GPU there, but nodecheck cannot place it: no ranks to bind"
    )
