"""The `nodecheck` command: options, output, exit status, and what it never prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from nodecheck.agent import cli as cli_module
from nodecheck.agent.cli import cli
from tests.conftest import CLEAN_ENVIRON, Node
from tests.fixtures.nodes import SECRET

NODECHECK = [sys.executable, "-m", "nodecheck.agent"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed command, as a user runs it (stdout is a pipe, not a terminal)."""
    environ = dict(CLEAN_ENVIRON, PATH=os.environ["PATH"], **(env or {}))
    if "PYTHONPATH" in os.environ:  # a checkout used without installing it
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(
        [*NODECHECK, *args], capture_output=True, text=True, env=environ, timeout=60, check=False
    )


@pytest.mark.parametrize("command", [[], ["check"], ["inventory"]])
def test_help_for_every_command(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    assert "--sysfs-root" in result.output and "--procfs-root" in result.output


def test_only_commands_that_work_are_offered() -> None:
    assert sorted(cli.commands) == ["check", "inventory"]


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("nodecheck, version ")


def test_missing_root_is_one_clear_line() -> None:
    done = run("--sysfs-root", "/does/not/exist", "check")
    assert done.returncode == 2
    assert done.stderr == "nodecheck: --sysfs-root /does/not/exist: no such directory\n"
    assert done.stdout == ""


def test_unknown_check_is_a_usage_error(dgx: Node) -> None:
    done = run(*dgx.cli_args, "check", "--only", "pcie_acss")
    assert done.returncode == 2
    assert "unknown check pcie_acss" in done.stderr and "pcie_acs" in done.stderr


def test_faulty_node_table(dgx_faulty: Node) -> None:
    done = run(*dgx_faulty.cli_args, "check")
    assert done.returncode == 1, done.stderr
    out = done.stdout
    assert "\x1b[" not in out  # colour only on a terminal
    assert out.splitlines()[0].startswith("nodecheck dgx-h100-07: FAIL (5 fail, 1 warn, ")
    assert out.index("\nFAIL\n") < out.index("\nWARN\n") < out.index("\nOK\n")
    assert "fix: sudo setpci -s 0000:39:00.0 ECAP_ACS+0x6.w=0000" in out
    assert SECRET not in out and SECRET not in done.stderr


def test_json_contract(dgx_faulty: Node) -> None:
    done = run(*dgx_faulty.cli_args, "check", "--json")
    assert done.returncode == 1
    document = json.loads(done.stdout)
    assert set(document) == {"schema", "hostname", "status", "results"}
    assert document["schema"] == "nodecheck.check/v1"
    assert document["hostname"] == "dgx-h100-07"
    assert document["status"] == "fail"
    for result in document["results"]:
        assert set(result) == {"check", "status", "subject", "summary", "remedy", "details"}
        assert result["status"] in {"ok", "warn", "fail", "skip", "error"}
    failing = {(r["check"], r["subject"]) for r in document["results"] if r["status"] == "fail"}
    assert ("pcie_link", "gpu 0000:9c:00.0") in failing
    assert SECRET not in done.stdout


def test_exit_status_healthy_and_undetermined(dgx: Node, build: object) -> None:
    assert run(*dgx.cli_args, "check").returncode == 0
    unprivileged = build("dgx-h100", unprivileged=True)  # type: ignore[operator]
    done = run(*unprivileged.cli_args, "check", "--json")
    assert done.returncode == 3
    assert json.loads(done.stdout)["status"] == "error"


def test_only_and_skip(dgx_faulty: Node) -> None:
    only = json.loads(run(*dgx_faulty.cli_args, "check", "--json", "--only", "numa").stdout)
    assert {r["check"] for r in only["results"]} == {"numa"}
    skipped = run(
        *dgx_faulty.cli_args, "check", "--json", "--skip", "pcie_acs", "--skip", "pcie_link"
    )
    checks = {r["check"] for r in json.loads(skipped.stdout)["results"]}
    assert checks == {"cpu", "nccl_env", "numa", "torch_alloc"}


def test_root_options_after_the_command(dgx: Node) -> None:
    result = CliRunner().invoke(cli, ["check", "--json", *dgx.cli_args], env=CLEAN_ENVIRON)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["hostname"] == "dgx-h100-01"


def test_calling_environment_is_audited(dgx: Node) -> None:
    done = run(*dgx.cli_args, "check", "--only", "nccl_env", env={"NCCL_P2P_LEVEL": "phb"})
    assert done.returncode == 0  # a warning
    assert "NCCL_P2P_LEVEL=phb" in done.stdout and "the calling environment" in done.stdout


def test_inventory_json(dgx: Node) -> None:
    done = run(*dgx.cli_args, "inventory", "--json")
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
    done = run(*workstation.cli_args, "inventory")
    assert done.returncode == 0
    assert "AMD Ryzen 9 7950X 16-Core Processor, 1 socket(s), 16 cores, 32 CPUs" in done.stdout
    assert "GPU0  X     PHB" in done.stdout


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


def test_heavy_modules_are_not_imported(dgx: Node, tmp_path: Path) -> None:
    """`--help` and `check` stay fast: no torch, no NVML binding, no Prometheus client."""
    script = (
        "import sys\n"
        "from nodecheck.agent.cli import cli\n"
        "for args in (['--help'], [*sys.argv[1:], 'check', '--json']):\n"
        "    try:\n"
        "        cli.main(args, standalone_mode=False)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = {'torch', 'pynvml', 'prometheus_client', 'cpuinfo'} & set(sys.modules)\n"
        "print('HEAVY', sorted(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *dgx.cli_args], capture_output=True, text=True, check=False
    )
    assert "HEAVY []" in done.stdout, done.stdout[-500:] + done.stderr
