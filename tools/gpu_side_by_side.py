"""On a GPU machine: what nodecheck reads through NVML, next to what nvidia-smi says.

    python -m tools.gpu_side_by_side            # field table, then nodecheck's GPU checks
    python -m tools.gpu_side_by_side --full     # ... and the whole `nvidia-smi -q`

Each row is one field of one GPU: nodecheck's reading (checks/node/gpu.py),
nvidia-smi's `--query-gpu` value, and whether they agree. Exit status 1 when
a field that cannot change between the two reads (name, UUID, VBIOS, memory
size, power limits, link maximums, ECC mode) differs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from nodecheck.checks.node.gpu import GpuReading, normalize_bus_id, read_gpus
from nodecheck.checks.node.nvml import NvmlSession
from nodecheck.checks.registry import checks_in


@dataclass(frozen=True)
class Field:
    label: str
    query: str  # nvidia-smi --query-gpu name
    ours: Callable[[GpuReading], object]
    static: bool  # cannot change between two reads a second apart


def _mib(value: int | None) -> object:
    return None if value is None else round(value / 2**20)


def _watts(value: float | None) -> object:
    return None if value is None else f"{value:.2f}"


FIELDS = (
    Field("name", "name", lambda g: g.name, True),
    Field("uuid", "uuid", lambda g: g.uuid, True),
    Field("vbios", "vbios_version", lambda g: g.vbios, True),
    Field("memory total MiB", "memory.total", lambda g: _mib(g.memory_total), True),
    Field("memory used MiB", "memory.used", lambda g: _mib(g.memory_used), False),
    Field("temperature C", "temperature.gpu", lambda g: g.temperature_c, False),
    Field("power W", "power.draw", lambda g: _watts(g.power_w), False),
    Field("power limit W", "power.limit", lambda g: _watts(g.power_limit_w), True),
    Field(
        "default limit W", "power.default_limit", lambda g: _watts(g.default_power_limit_w), True
    ),
    Field(
        "persistence",
        "persistence_mode",
        lambda g: (
            None if g.persistence_mode is None else ["Disabled", "Enabled"][g.persistence_mode]
        ),
        True,
    ),
    Field(
        "ECC mode",
        "ecc.mode.current",
        lambda g: None if g.ecc_mode is None else ["Disabled", "Enabled"][g.ecc_mode[0]],
        True,
    ),
    Field(
        "volatile uncorrected ECC",
        "ecc.errors.uncorrected.volatile.total",
        lambda g: g.ecc.volatile_uncorrected,
        False,
    ),
    Field("PCIe gen", "pcie.link.gen.current", lambda g: g.pcie and g.pcie.generation, False),
    Field("PCIe max gen", "pcie.link.gen.max", lambda g: g.pcie and g.pcie.max_generation, True),
    Field("PCIe width", "pcie.link.width.current", lambda g: g.pcie and g.pcie.width, False),
    Field("PCIe max width", "pcie.link.width.max", lambda g: g.pcie and g.pcie.max_width, True),
    Field(
        "clock event reasons",
        "clocks_event_reasons.active",
        lambda g: None if g.clock_event_reasons is None else f"0x{g.clock_event_reasons:016X}",
        False,
    ),
)


def query(smi: str, field: str) -> dict[str, str]:
    """bus id -> value of one --query-gpu field ("n/a" when nvidia-smi rejects it)."""
    done = subprocess.run(
        [smi, f"--query-gpu=pci.bus_id,{field}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    values = {}
    for line in done.stdout.strip().splitlines() if done.returncode == 0 else []:
        bus, _, value = line.partition(",")
        values[normalize_bus_id(bus)] = value.strip()
    return values


def agree(ours: object, theirs: str | None) -> bool | None:
    if ours is None or theirs in (None, "", "[N/A]", "[Not Supported]"):
        return None
    if isinstance(ours, str) and theirs is not None:
        return ours.strip().lower() == theirs.strip().lower()
    try:
        return abs(float(str(ours)) - float(str(theirs))) < 0.5
    except ValueError:
        return str(ours) == theirs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also print nvidia-smi -q")
    args = parser.parse_args(argv)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        print("nvidia-smi not found: run this on a GPU machine", file=sys.stderr)
        return 2
    snapshot = read_gpus(NvmlSession())
    if not snapshot.usable:
        print(f"nodecheck cannot use NVML: {snapshot.unavailable or snapshot.hung}")
        return 2
    print(f"driver: nodecheck {snapshot.driver_version}")
    theirs = {field.query: query(smi, field.query) for field in FIELDS}
    mismatches = 0
    for gpu in snapshot.gpus:
        print(f"\nGPU {gpu.index} {gpu.bus_id}")
        print(f"  {'field':26} {'nodecheck':40} {'nvidia-smi':40} agree")
        for field in FIELDS:
            mine = field.ours(gpu)
            other = theirs[field.query].get(gpu.bus_id or "")
            same = agree(mine, other)
            shown = {True: "yes", False: "NO", None: "-"}[same]
            if same is False and field.static:
                mismatches += 1
            print(f"  {field.label:26} {mine!s:40} {other or 'n/a':40} {shown}")
    print()
    checks = [f"--only={name}" for name in checks_in("nodecheck.checks.gpu")]
    subprocess.run([sys.executable, "-m", "nodecheck.agent", "check", *checks], check=False)
    if args.full:
        print()
        subprocess.run([smi, "-q"], check=False)
    if mismatches:
        print(f"\n{mismatches} static field(s) differ", file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
