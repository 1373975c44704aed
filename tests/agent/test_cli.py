"""The `nodecheck` command: options, output, exit status, and what it never prints."""

from __future__ import annotations

import ctypes.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from nodecheck.agent import cli as cli_module
from nodecheck.agent.cli import cli
from tests.conftest import CLEAN_ENVIRON, Node
from tests.fixtures.graft import placed_gpus_spec
from tests.fixtures.nodegen import build_node
from tests.fixtures.nodes import SECRET
from tests.fixtures.nvml_scenarios import dgx_healthy, modified

NODECHECK = [sys.executable, "-m", "nodecheck.agent"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed command, as a user runs it (stdout is a pipe, not a terminal)."""
    environ = {**CLEAN_ENVIRON, "PATH": os.environ["PATH"], **(env or {})}  # env may set PATH
    if "PYTHONPATH" in os.environ:  # a checkout used without installing it
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(
        [*NODECHECK, *args], capture_output=True, text=True, env=environ, timeout=60, check=False
    )


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["check"],
        ["inventory"],
        ["bench"],
        ["bench", "network"],
        ["agent"],
        ["tune"],
        ["exec"],
        ["mfu"],
        ["snapshot"],
        ["capture"],
        ["config"],
        ["config", "show"],
        ["config", "check"],
        ["slurm", "health-check"],
        ["npd"],
    ],
)
def test_help_for_every_command(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    assert "--sysfs-root" in result.output and "--procfs-root" in result.output


def test_only_commands_that_work_are_offered() -> None:
    assert cli.list_commands(click.Context(cli)) == [
        "agent",
        "bench",
        "capture",
        "check",
        "config",
        "exec",
        "inventory",
        "mfu",
        "npd",
        "slurm",
        "snapshot",
        "tune",
    ]


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("nodecheck, version ")


def test_missing_root_is_one_clear_line() -> None:
    done = run("--sysfs-root", "/does/not/exist", "check")
    assert done.returncode == 2
    assert done.stderr == "nodecheck: --sysfs-root /does/not/exist: no such directory\n"
    assert done.stdout == ""


def test_unknown_check_is_a_usage_error(dgx: Node) -> None:
    done = run(*dgx.cli_args, "check", "--only", "pcie_acss", env=dgx.env)
    assert done.returncode == 2
    assert "unknown check pcie_acss" in done.stderr and "pcie_acs" in done.stderr


def test_faulty_node_table(dgx_faulty: Node) -> None:
    done = run(*dgx_faulty.cli_args, "check", env=dgx_faulty.env)
    assert done.returncode == 1, done.stderr
    out = done.stdout
    assert "\x1b[" not in out  # colour only on a terminal
    assert out.splitlines()[0].startswith("nodecheck dgx-h100-07: FAIL (")
    assert out.index("\nFAIL\n") < out.index("\nWARN\n") < out.index("\nOK\n")
    assert "fix: sudo setpci -s 0000:39:00.0 ECAP_ACS+0x6.w=0000" in out
    assert SECRET not in out and SECRET not in done.stderr


def test_json_contract(dgx_faulty: Node) -> None:
    done = run(*dgx_faulty.cli_args, "check", "--json", env=dgx_faulty.env)
    assert done.returncode == 1
    document = json.loads(done.stdout)
    assert set(document) == {"schema", "hostname", "status", "written_at", "checks", "results"}
    assert document["schema"] == "nodecheck.check/v2"
    assert {c["check"] for c in document["checks"]} == {r["check"] for r in document["results"]}
    for check in document["checks"]:
        assert set(check) == {"check", "finished_at", "interval_s", "benchmark", "completed"}
    assert document["hostname"] == "dgx-h100-07"
    assert document["status"] == "fail"
    for result in document["results"]:
        assert set(result) == {
            "check",
            "status",
            "subject",
            "summary",
            "remedy",
            "action",
            "class",
            "origin",
            "details",
        }
        assert result["status"] in {"ok", "warn", "fail", "skip", "error"}
        assert result["origin"] in {"node", "job"}
    failing = {(r["check"], r["subject"]) for r in document["results"] if r["status"] == "fail"}
    assert ("pcie_link", "gpu 0000:9c:00.0") in failing
    assert SECRET not in done.stdout


def test_exit_status_healthy_and_undetermined(dgx: Node, build: object, tmp_path: Path) -> None:
    assert run(*dgx.cli_args, "check", env=dgx.env).returncode == 0
    # A kernel log that is no text (and no NVML event listener in a one-shot run): XIDs
    # undetermined.
    garbled = tmp_path / "kern.log"
    garbled.write_bytes(b"abc\x01\x02def\n")
    done = run(*dgx.cli_args, "check", "--json", "--kernel-log", str(garbled), env=dgx.env)
    assert done.returncode == 3
    assert json.loads(done.stdout)["status"] == "error"
    # Without root, ACS is out of reach for good: a skip that says so, not an error.
    unprivileged = build("dgx-h100", unprivileged=True)  # type: ignore[operator]
    done = run(*unprivileged.cli_args, "check", "--json", env=unprivileged.env)
    assert done.returncode == 0, done.stdout
    [acs] = [r for r in json.loads(done.stdout)["results"] if r["check"] == "pcie_acs"]
    assert acs["status"] == "skip" and acs["details"]["cause"] == "unprivileged"


def test_only_and_skip(dgx_faulty: Node) -> None:
    only = json.loads(
        run(*dgx_faulty.cli_args, "check", "--json", "--only", "numa", env=dgx_faulty.env).stdout
    )
    assert {r["check"] for r in only["results"]} == {"numa"}
    skipped = run(
        *dgx_faulty.cli_args,
        "check",
        "--json",
        "--skip",
        "pcie_acs",
        "--skip",
        "pcie_link",
        env=dgx_faulty.env,
    )
    checks = {r["check"] for r in json.loads(skipped.stdout)["results"]}
    assert "pcie_acs" not in checks and "pcie_link" not in checks
    assert {"cpu", "nccl_env", "numa", "torch_alloc", "gpu_count", "gpu_xid"} <= checks


def test_only_and_skip_take_commas_and_repeats(dgx_faulty: Node) -> None:
    """`--only cpu,numa` was refused as one unknown name; commas and repeats now mix."""
    args = ["check", "--json", "--only", "cpu,numa", "--only", "gpu_count", "--skip", "numa"]
    done = run(*dgx_faulty.cli_args, *args, env=dgx_faulty.env)
    assert done.returncode in (0, 1, 3), done.stderr
    assert {r["check"] for r in json.loads(done.stdout)["results"]} == {"cpu", "gpu_count"}


def test_check_help_lists_every_registered_check() -> None:
    """The names --only and --skip take, from the registry, in the help's wrapped text."""
    from nodecheck.checks.registry import load_checks

    done = run("check", "--help")
    assert done.returncode == 0, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines())
    listed = " ".join(done.stdout.split("Checks (for --only and --skip):", 1)[1].split())
    assert listed == ", ".join(load_checks()) + "."


def test_root_options_after_the_command(dgx: Node) -> None:
    environ = {**CLEAN_ENVIRON, **dgx.env}
    result = CliRunner().invoke(cli, ["check", "--json", *dgx.cli_args], env=environ)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["hostname"] == "dgx-h100-01"


def test_calling_environment_is_audited(dgx: Node) -> None:
    done = run(
        *dgx.cli_args, "check", "--only", "nccl_env", env={**dgx.env, "NCCL_P2P_LEVEL": "phb"}
    )
    assert done.returncode == 0  # a warning
    assert "NCCL_P2P_LEVEL=phb" in done.stdout and "the calling environment" in done.stdout


def test_inventory_json(dgx: Node) -> None:
    done = run(*dgx.cli_args, "inventory", "--json", env=dgx.env)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["schema"] == "nodecheck.inventory/v1"
    assert document["cpu"]["model"] == "Intel(R) Xeon(R) Platinum 8480C"
    assert [g["numa_node"] for g in document["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    names = document["topology"]["devices"]
    matrix = document["topology"]["matrix"]
    relation = {(a, b): matrix[i][j] for i, a in enumerate(names) for j, b in enumerate(names)}
    assert relation["GPU0", "NIC0"] == "PIX"
    assert relation["GPU0", "GPU4"] == "SYS"
    assert relation["GPU0", "GPU2"] == "NODE"
    assert document["nics"][0]["name"] == "mlx5_0"


def test_inventory_table(workstation: Node) -> None:
    done = run(*workstation.cli_args, "inventory", env=workstation.env)
    assert done.returncode == 0
    assert "AMD Ryzen 9 7950X 16-Core Processor, 1 socket(s), 16 cores, 32 CPUs" in done.stdout
    assert "GPU0  X     PHB" in done.stdout


def test_inventory_shows_what_the_reading_inferred(tmp_path: Path) -> None:
    """A tree that says less than the kernel means (no `online` file, CPU 7 offline though
    node 1 lists it, node 0 without its directory): the text view prints each inference
    under the Node line, the JSON under "cpu", "numa_notes" and each node."""
    root = tmp_path / "incomplete"
    build_node(placed_gpus_spec([0, 1], sockets=2, cores=4), root)
    cpus = root / "sys" / "devices" / "system" / "cpu"
    (cpus / "online").unlink()
    (cpus / "cpu7" / "online").write_text("0\n")
    shutil.rmtree(root / "sys" / "devices" / "system" / "node" / "node0")
    node = Node(root)
    done = run(*node.cli_args, "inventory")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Node ")
    online = "devices/system/cpu/online missing: online CPUs 0-6 taken from present"
    offline_node = "CPUs 0-3 link to node 0 (cpuN/node0) but devices/system/node has no node0"
    assert lines[1].startswith(f"  note: {online}")
    assert lines[2].startswith(f"  note: {offline_node}")
    assert lines[3] == "  note: node 1: offline CPUs 7 left out"
    assert lines[4] == ""  # each note once: node 0's own is the reading's
    document = json.loads(run(*node.cli_args, "inventory", "--json").stdout)
    assert document["cpu"]["notes"][0].startswith(online)
    assert document["numa_notes"][0].startswith(offline_node)
    assert [n["notes"] for n in document["numa_nodes"]][1] == ["offline CPUs 7 left out"]


def test_no_traceback_reaches_the_user(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def explode(*args: object, **kwargs: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(cli_module.cli, "main", explode)
    with pytest.raises(SystemExit) as exit_info:
        cli_module.main()
    assert exit_info.value.code == 3
    err = capsys.readouterr().err
    assert err == "nodecheck: internal error: OSError: disk on fire\n"


HEAVY_PROBE = (
    "import json, sys\n"
    "from nodecheck.agent.cli import cli\n"
    "try:\n"
    "    cli.main(sys.argv[1:], standalone_mode=False)\n"
    "except SystemExit:\n"
    "    pass\n"
    "heavy = {'torch', 'pynvml', 'prometheus_client', 'cpuinfo'} & set(sys.modules)\n"
    "print('HEAVY ' + json.dumps(sorted(heavy)), file=sys.stderr)\n"
)


def run_counting_imports(
    args: list[str], env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run the command in-process in a fresh interpreter; which heavy modules it imported."""
    done = subprocess.run(
        [sys.executable, "-c", HEAVY_PROBE, *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **env},
        timeout=120,
    )
    line = next(line for line in done.stderr.splitlines() if line.startswith("HEAVY "))
    return done, set(json.loads(line.removeprefix("HEAVY ")))


@pytest.mark.parametrize(
    ("command", "allowed"),
    [(["--help"], set()), (["check", "--json"], {"pynvml"}), (["tune", "--format", "json"], set())],
)
def test_heavy_modules_are_not_imported(dgx: Node, command: list[str], allowed: set[str]) -> None:
    """`--help` and `tune` import nothing heavy; `check` needs the NVML binding but never
    torch, the Prometheus client or py-cpuinfo."""
    args = command if command == ["--help"] else [*dgx.cli_args, *command]
    done, heavy = run_counting_imports(args, dgx.env)
    assert heavy == allowed, done.stderr[-500:]


def test_hung_nvml_call_leaves_the_cli_responsive(dgx: Node, tmp_path: Path) -> None:
    """A GPU whose NVML calls never return (the fake sleeps for an hour): the command
    still finishes, marks that GPU undetermined and exits 3."""
    scenario = modified(dgx_healthy(), gpu=5, hang={"nvmlDeviceGetTemperatureV": 0})
    node = dgx.with_scenario(scenario, tmp_path / "hang.json")
    done = run(*node.cli_args, "check", "--json", env=node.env)
    assert done.returncode == 3, done.stderr
    document = json.loads(done.stdout)
    hung = [r for r in document["results"] if r["subject"] == "gpu 0000:9c:00.0"]
    assert any(r["summary"].startswith("NVML did not answer in 2 s") for r in hung)
    assert {r["status"] for r in document["results"]} <= {"ok", "skip", "error"}


def test_inventory_shows_what_nvml_sees(dgx_faulty: Node) -> None:
    done = run(*dgx_faulty.cli_args, "inventory", env=dgx_faulty.env)
    assert done.returncode == 0, done.stderr
    assert "GPUs (NVML: driver 570.124.06, CUDA 12.8)" in done.stdout
    first = next(line for line in done.stdout.splitlines() if "0000:18:00.0" in line)
    assert "NVIDIA H100 80GB HBM3" in first and "80 GiB" in first and "18/18 active" in first
    assert "GPU-6f0c0000-1b2e-4d5c-9a7b-000000000018" in first
    assert "16/18 active" in next(line for line in done.stdout.splitlines() if "9a:00.0" in line)
    missing = next(line for line in done.stdout.splitlines() if "0000:bc:00.0" in line)
    assert "not seen by NVML" in missing
    document = json.loads(
        run(*dgx_faulty.cli_args, "inventory", "--json", env=dgx_faulty.env).stdout
    )
    assert document["nvml"]["driver_version"] == "570.124.06"
    nvml = [gpu["nvml"] for gpu in document["gpus"]]
    assert nvml[7] is None
    assert nvml[4]["nvlink"] == {"links": 18, "active": 16}
    assert nvml[0]["unsupported"] == []
    assert [entry["index"] for entry in nvml[:7]] == list(range(7))


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVML library"
)
def test_no_nvml_library_on_a_gpu_node_is_undetermined(dgx: Node) -> None:
    """The system's NVML (none here): GPUs on the bus but no way to judge them."""
    args = [arg for arg in dgx.cli_args if arg not in ("--nvml-library", str(dgx.nvml_library))]
    done = run(*args, "check", "--json", "--only", "gpu_count", "--only", "gpu_state")
    assert done.returncode == 3, done.stderr
    results = {r["check"]: r for r in json.loads(done.stdout)["results"]}
    assert results["gpu_count"]["status"] == "error"
    assert "8 GPU(s) on the PCI bus, but NVML library not found" in results["gpu_count"]["summary"]
    assert results["gpu_state"] == {**results["gpu_state"], "status": "skip"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nvml-timeout", "nan"], "'nan' is not a finite number"),
        (["--nvml-timeout", "60"], "60.0 is not in the range 0.1<=x<=8.0"),
        (["--nvml-library", "/no/such/libnvidia-ml.so.1"], "does not exist"),
        (["check", "--kernel-log", "/no/such/kern.log"], "does not exist"),
    ],
)
def test_bad_nvml_and_kernel_log_options(args: list[str], message: str) -> None:
    done = run(*args, *([] if args[0] == "check" else ["check"]))
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_inventory_lists_what_a_geforce_lacks(workstation: Node) -> None:
    document = json.loads(
        run(*workstation.cli_args, "inventory", "--json", env=workstation.env).stdout
    )
    [gpu] = document["gpus"]
    assert gpu["nvml"]["name"] == "NVIDIA GeForce RTX 4090"
    assert {"ecc_mode", "remapped_rows", "retired_pages"} <= set(gpu["nvml"]["unsupported"])
    assert gpu["nvml"]["nvlink"] is None


def test_bench_on_the_cpu(build: Callable[..., Node], tmp_path: Path) -> None:
    """The real benchmark through the command; the command itself never imports torch."""
    node = build("cpu-only")
    args = [*node.cli_args, "bench", "h2d", "--device", "cpu", "--duration", "0.3"]
    args += ["--state-dir", str(tmp_path), "--json"]
    done, heavy = run_counting_imports(args, node.env)
    assert "torch" not in heavy, done.stderr
    document = json.loads(done.stdout)
    assert document["schema"] == "nodecheck.check/v2"
    [result] = document["results"]
    assert (result["check"], result["status"], result["subject"]) == ("h2d", "ok", "node")
    assert (tmp_path / "benchmarks.json").exists()


def test_bench_usage_errors(dgx: Node) -> None:
    done = run(*dgx.cli_args, "bench", "matmul", "--gpus", "0,x", env=dgx.env)
    assert done.returncode == 2 and "expected GPU indices like 0,1,2" in done.stderr
    done = run(*dgx.cli_args, "bench", "matmul", "--gpus", "9", "--force", env=dgx.env)
    assert done.returncode == 3
    assert "GPU 9 not found or not readable through NVML" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0,0"], "--gpus takes distinct GPU indices"),
        (["--gpus", "0", "--device", "cpu"], "only with --device cuda"),
        (["--warn-below", "0.7", "--fail-below", "0.8"], "--fail-below must not be above"),
    ],
)
def test_bench_option_errors(dgx: Node, args: list[str], message: str) -> None:
    done = run(*dgx.cli_args, "bench", "matmul", *args, env=dgx.env)
    assert done.returncode == 2 and message in done.stderr


def test_bench_that_measured_nothing_is_undetermined(dgx: Node, tmp_path: Path) -> None:
    """GPU 0 runs a job in the healthy scenario: the benchmark skips, and says so by exit 3."""
    args = ["bench", "h2d", "--device", "cpu", "--idle-window", "0", "--state-dir", str(tmp_path)]
    done = run(*dgx.cli_args, *args, env=dgx.env)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "not run: GPU 0 (0000:18:00.0) is in use by pid 5151 (python3)" in done.stdout


def test_the_checks_doc_example_is_what_the_demo_prints(tmp_path: Path) -> None:
    """docs/checks.md's example block comes from `python -m tests.fixtures.demo --excerpt`
    (make demo): the commands it shows reproduce it."""
    from tests.fixtures.demo import example_excerpt, run_demo

    doc = (Path(__file__).resolve().parents[2] / "docs" / "checks.md").read_text()
    section = doc.split("## Example: the faulty 8-GPU replica node", 1)[1]
    shown = section.split("--excerpt` prints it", 1)[1].split("```\n", 2)[1]
    done = run_demo(tmp_path, [], capture=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert example_excerpt(done.stdout) == shown
