"""`tune --python` and `exec`'s command as the job's Python, through the installed command:
the versions each reads, the names they set, and the JSON that says where from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.agent.test_cli import run
from tests.agent.test_tune import box, document, exec_report, numactl  # noqa: F401 - fixtures
from tests.checks.test_job_versions import fake_venv
from tests.conftest import Node


def test_tune_reads_the_named_venv(dgx: Node, tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv", torch="2.8.0", nccl="2.18.3")
    doc = document(dgx, "--python", str(venv / "bin" / "python"))
    how = "its site-packages read without starting it (a venv)"
    assert doc["versions"] == {
        "torch": {
            "version": "2.8.0",
            "from": f"--python {venv / 'bin' / 'python'}, {how}",
            "known": True,
            "seen_elsewhere": [],
        },
        "nccl": {
            "version": "2.18.3",
            "from": f"nvidia-nccl-cu12 in --python {venv / 'bin' / 'python'}, {how}",
            "known": True,
            "seen_elsewhere": [],
        },
    }
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in doc["env"] and "TORCH_FR_BUFFER_SIZE" not in doc["env"]
    assert "PYTORCH_ALLOC_CONF" not in doc["env"]
    [timeout] = [left for left in doc["left_unset"] if left["names"] == ["NCCL_IB_TIMEOUT"]]
    assert timeout["reason"].startswith("the default of NCCL 2.18.3 (from nvidia-nccl-cu12 in")


def test_tune_without_python_sets_both_names(dgx: Node) -> None:
    doc = document(dgx)
    assert doc["versions"]["torch"]["known"] is False
    assert {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} <= set(doc["env"])
    assert {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"} <= set(doc["env"])


def test_tune_python_problems_are_said_not_guessed(dgx: Node, tmp_path: Path) -> None:
    doc = document(dgx, "--python", str(tmp_path / "missing"))
    assert doc["versions"]["torch"]["known"] is False
    missing = tmp_path / "missing"
    assert doc["versions"]["torch"]["seen_elsewhere"][0] == (
        f"--python {missing} could not be read: {missing}: missing"
    )
    done = run(*dgx.cli_args, "tune", "--format", "json", "--python", str(missing))
    assert done.returncode == 0
    assert done.stderr == (
        f"nodecheck tune: warning: --python {missing} could not be read ({missing}: missing): "
        "the job's versions are taken from a running job, else unknown\n"
    )
    done = run(*dgx.cli_args, "tune", "--python", " ")
    assert done.returncode == 2 and "--python: give the path" in done.stderr
    capture = tmp_path / "facts.json"
    assert run(*dgx.cli_args, "capture", "-o", str(capture)).returncode in (0, 3)
    done = run("tune", "--facts", str(capture), "--python", sys.executable)
    assert done.returncode == 2 and "a capture (--facts) holds its own" in done.stderr


@pytest.mark.usefixtures("numactl")
def test_exec_reads_its_commands_python(box: Node, tmp_path: Path) -> None:  # noqa: F811
    """CMD is this venv's Python, whose torch (the CPU build the tests install) is 2.9 or
    later: only the new names; --python naming an older torch's venv wins over CMD."""
    done, child = exec_report(box, tmp_path, env={"LOCAL_RANK": "0"})
    from importlib.metadata import version

    torch = version("torch")
    assert f"; versions: torch {torch} (from exec's command {sys.executable}, " in done.stderr
    env = child["env"]
    assert isinstance(env, dict)
    assert "TORCH_FR_BUFFER_SIZE" in env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env
    old = fake_venv(tmp_path / "old", torch="2.7.1")
    _, child = exec_report(box, tmp_path, "--python", str(old), env={"LOCAL_RANK": "0"})
    env = child["env"]
    assert isinstance(env, dict)
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in env and "TORCH_FR_BUFFER_SIZE" not in env
    assert "PYTORCH_ALLOC_CONF" not in env


def test_exec_odd_command_names_exit_as_the_shell_does(box: Node, tmp_path: Path) -> None:  # noqa: F811
    """An empty CMD or one with a tab is not a --python usage error: exec says 127 (not
    found) or 126 (cannot be run) as for any other name; its versions stay unknown."""
    env = {"LOCAL_RANK": "0"}
    for name in ("", "no\tsuch"):
        done = run(*box.cli_args, "exec", "--", name, env=env)
        assert done.returncode == 127, done.stderr
        assert "command not found" in done.stderr and "--python" not in done.stderr
    odd = tmp_path / "odd\tname"
    odd.write_text("#!/bin/sh\n")
    done = run(*box.cli_args, "exec", "--", str(odd), env=env)
    assert done.returncode == 126 and "cannot be run" in done.stderr, done.stderr
    assert run(*box.cli_args, "exec", "--python", "\t", "--", "true", env=env).returncode == 2


def test_tune_python_refuses_to_start_a_non_python(dgx: Node, tmp_path: Path) -> None:
    """--python /bin/true is never run: one warning line, the versions unknown."""
    done = run(*dgx.cli_args, "tune", "--format", "json", "--python", "/bin/true")
    assert done.returncode == 0
    assert done.stderr == (
        "nodecheck tune: warning: --python /bin/true could not be read (/bin/true is not a "
        "Python interpreter (neither it nor the file it links to is named python, python3 "
        "or pythonX.Y): not started): the job's versions are taken from a running job, else "
        "unknown\n"
    )
    assert json.loads(done.stdout)["versions"]["torch"]["known"] is False
