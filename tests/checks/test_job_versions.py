"""The job's torch and NCCL: a venv and a conda environment read as they lie, a real
interpreter asked for its paths, exec's command followed to its interpreter, and a running
process's mapped libnccl and libtorch read from a literal /proc/<pid>/maps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.job_python import (
    EXEC_COMMAND,
    JobPython,
    JobPythonReading,
    command_interpreter,
    env_command,
    parse_pyvenv_cfg,
    parse_shebang,
    read_job_python,
)
from nodecheck.checks.node.job_versions import (
    JobVersions,
    ProcessLibraries,
    mapped_paths,
    read_job_versions,
)
from nodecheck.checks.node.nccl_library import NcclLibraries, NcclLibrary
from nodecheck.checks.node.torch_package import TorchVersion
from nodecheck.checks.node.variables import GpuProcess
from nodecheck.checks.rules.job_versions import job_nccl, job_torch

ENVIRON = {"PATH": "/usr/bin:/bin"}


def metadata(site: Path, folder: str, name: str, version: str) -> None:
    (site / folder).mkdir(parents=True)
    (site / folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nVersion: 0.0 later\n"
    )


def fake_venv(prefix: Path, torch: str = "2.8.0", nccl: str | None = "2.21.5") -> Path:
    """A venv as `python -m venv` lays it out, with torch's and NCCL's metadata only."""
    site = prefix / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (prefix / "pyvenv.cfg").write_text(
        "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n"
    )
    (prefix / "bin").mkdir()
    # A link to a Python that does not exist: reading the venv must start nothing.
    (prefix / "bin" / "python").symlink_to("/nonexistent/python3.11")
    metadata(site, f"torch-{torch}.dist-info", "torch", torch)
    if nccl is not None:
        metadata(site, f"nvidia_nccl_cu12-{nccl}.dist-info", "nvidia-nccl-cu12", nccl)
    return prefix


def test_a_venv_is_read_without_starting_its_interpreter(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv")
    for named in (venv / "bin" / "python", venv):
        found = read_job_python(JobPython(str(named), "--python"), ENVIRON)
        assert (found.torch, found.nccl, found.nccl_package) == (
            "2.8.0",
            "2.21.5",
            "nvidia-nccl-cu12",
        )
        assert found.problem == ""
        assert found.how == "its site-packages read without starting it (a venv)"
        assert found.origin == f"--python {named}, {found.how}"


def test_pythonpath_comes_before_the_venv_as_python_puts_it(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv")
    metadata(tmp_path / "extra", "torch-2.10.0.dist-info", "torch", "2.10.0")
    environ = {**ENVIRON, "PYTHONPATH": str(tmp_path / "extra")}
    found = read_job_python(JobPython(str(venv), "--python"), environ)
    assert found.torch == "2.10.0"


def test_a_conda_environment_is_read_as_it_lies(tmp_path: Path) -> None:
    prefix = tmp_path / "conda"
    (prefix / "conda-meta").mkdir(parents=True)
    site = prefix / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    metadata(site, "torch-2.9.1.dist-info", "torch", "2.9.1")
    found = read_job_python(JobPython(str(prefix), "--python"), ENVIRON)
    assert (found.torch, found.nccl) == ("2.9.1", None)
    assert "a conda environment" in found.how


def test_what_cannot_be_read_says_why(tmp_path: Path) -> None:
    missing = read_job_python(JobPython(str(tmp_path / "nope"), "--python"), ENVIRON)
    assert missing.problem == f"{tmp_path / 'nope'}: missing" and missing.torch is None
    plain = read_job_python(JobPython(str(tmp_path), "--python"), ENVIRON)
    assert "not an environment to read" in plain.problem
    assert parse_pyvenv_cfg("Home = /usr\ninclude-system-site-packages=TRUE\n") == {
        "home": "/usr",
        "include-system-site-packages": "TRUE",
    }


def test_a_real_interpreter_is_asked_once_with_its_system_site_packages(tmp_path: Path) -> None:
    """A venv that includes the system's site-packages cannot be read as it lies: its
    real interpreter is started (-S) and answers its paths, the venv's among them."""
    venv = tmp_path / "sysvenv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
    )
    [site] = (venv / "lib").glob("python3*/site-packages")
    metadata(site, "torch-2.9.0+cu128.dist-info", "torch", "2.9.0+cu128")
    found = read_job_python(JobPython(str(venv / "bin" / "python"), "--python"), ENVIRON)
    assert found.problem == "" and found.torch == "2.9.0+cu128"
    assert found.how.startswith("asked the interpreter for its paths (one start-up with -S, ")


def test_an_interpreter_that_fails_is_a_problem_not_a_version(tmp_path: Path) -> None:
    broken = tmp_path / "python3"
    broken.write_text("#!/bin/sh\necho 'no such module' >&2\nexit 3\n")
    broken.chmod(0o755)
    found = read_job_python(JobPython(str(broken), "--python"), ENVIRON)
    assert found.torch is None and found.problem == f"{broken} exited 3: no such module"


def test_exec_command_is_followed_to_its_interpreter(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv", torch="2.9.1")
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(f"#!{venv}/bin/python\nimport sys\n")
    torchrun.chmod(0o755)
    search = f"{venv / 'bin'}:/usr/bin"
    assert command_interpreter("torchrun", search) == (venv / "bin" / "python", "")
    found = read_job_python(JobPython("torchrun", EXEC_COMMAND), {"PATH": search})
    python = venv / "bin" / "python"
    assert found.torch == "2.9.1" and found.named == f"exec's command torchrun ({python})"
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nexec python train.py\n")
    script.chmod(0o755)
    assert command_interpreter(str(script), search) == (
        None,
        f"{script} is a script run by /bin/bash, not by Python",
    )
    assert parse_shebang(b"#!/usr/bin/env python3 -u\n") == ["/usr/bin/env", "python3 -u"]
    assert parse_shebang(b"\x7fELF") is None


def test_a_running_process_maps_name_its_nccl_and_torch(tmp_path: Path) -> None:
    root, proc = tmp_path / "root", tmp_path / "root" / "proc"
    site = root / "opt" / "venv" / "lib" / "python3.11" / "site-packages"
    metadata(site, "torch-2.9.1+cu128.dist-info", "torch", "2.9.1+cu128")
    metadata(site, "nvidia_nccl_cu12-2.27.3.dist-info", "nvidia-nccl-cu12", "2.27.3")
    lib = "/opt/venv/lib/python3.11/site-packages"
    maps = {
        4242: [
            "/usr/bin/python3.11",
            f"{lib}/torch/lib/libtorch_cuda.so",
            f"{lib}/nvidia/nccl/lib/libnccl.so.2",
            f"{lib}/torch/lib/libc10.so",
        ],
        4343: ["/usr/lib/x86_64-linux-gnu/libnccl.so.2.18.3"],
    }
    for pid, paths in maps.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "root").symlink_to("../..")
        (proc / str(pid) / "maps").write_text(
            "".join(
                f"7f00{i:04x}000-7f00{i:04x}800 r-xp 00000000 103:02 {9 + i}   {path}\n"
                for i, path in enumerate(paths)
            )
            + "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0   [stack]\n"
        )
    fs = NodeFS(sysfs=tmp_path / "sys", procfs=proc, rootfs=root)
    processes = [GpuProcess(4343, "python3", ["/dev/nvidia1"]), GpuProcess(4242, "python3", [])]
    found = read_job_versions(fs, None, ENVIRON, processes)
    # The lowest pid answered; the rank after it was not read.
    [first] = found.processes
    assert (first.pid, first.torch, first.nccl) == (4242, "2.9.1+cu128", "2.27.3")
    assert (
        first.nccl_where == f"nvidia-nccl-cu12 beside its mapped {lib}/nvidia/nccl/lib/libnccl.so.2"
    )
    assert found.not_read == (4343,)
    torch = job_torch(found, TorchVersion((2, 13), "2.13.0+cpu"))
    assert torch.known == (2, 9, 1)
    assert torch.describe() == (
        f"torch 2.9.1+cu128 (from pid 4242 (python3), torch's metadata beside its mapped "
        f"{lib}/torch/lib/libtorch_cuda.so)"
    )
    # A distribution's libnccl names its version in the file.
    alone = read_job_versions(fs, None, ENVIRON, processes[:1])
    assert alone.processes[0].nccl == "2.18.3" and alone.processes[0].torch is None
    assert job_nccl(alone, None).describe() == (
        "NCCL 2.18.3 (from pid 4343 (python3), its mapped "
        "/usr/lib/x86_64-linux-gnu/libnccl.so.2.18.3)"
    )


def test_maps_paths_keep_spaces_and_drop_deleted_and_anonymous() -> None:
    maps = (
        "7f0000000000-7f0000001000 r-xp 00000000 103:02 12   /opt/my env/libnccl.so.2.21.5\n"
        "7f0000001000-7f0000002000 r--p 00001000 103:02 12   /opt/my env/libnccl.so.2.21.5\n"
        "7f0000002000-7f0000003000 r-xp 00000000 103:02 13   /tmp/libx.so (deleted)\n"
        "7f0000003000-7f0000004000 rw-p 00000000 00:00 0\n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0   [heap]\n"
    )
    assert mapped_paths(maps) == ["/opt/my env/libnccl.so.2.21.5"]


def test_nodecheck_own_torch_is_said_but_not_the_jobs(tmp_path: Path) -> None:
    torch = job_torch(None, TorchVersion((2, 13), "2.13.0+cpu"))
    assert torch.known is None and torch.at_least((2, 9)) is None
    assert torch.account() == (
        "the job's torch is not known (torch 2.13.0+cpu is in nodecheck's own Python, which "
        "the job may not run: --python names the job's)"
    )


@pytest.mark.skipif(not os.access("/usr/bin/env", os.X_OK), reason="no /usr/bin/env")
def test_env_shebang_looks_python_up_on_path(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv")
    script = tmp_path / "train.py"
    script.write_text("#!/usr/bin/env python\nprint()\n")
    script.chmod(0o755)
    search = f"{venv / 'bin'}:/usr/bin"
    # The venv's python is a dangling link: PATH lookup wants an executable file.
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").write_text("")
    (venv / "bin" / "python").chmod(0o755)
    assert command_interpreter(str(script), search) == (venv / "bin" / "python", "")


def test_env_options_are_skipped_as_env_parses_them(tmp_path: Path) -> None:
    """`#!/usr/bin/env -S python3 -u` runs python3 (-S splits its string; -u NAME takes
    a value); without -S Linux hands env "python3 -u" as one name, which is no Python."""
    venv = fake_venv(tmp_path / "venv")
    python3 = venv / "bin" / "python3"
    python3.write_text("")
    python3.chmod(0o755)
    search = f"{venv / 'bin'}:/usr/bin"
    for shebang in (
        "#!/usr/bin/env -S python3 -u",
        "#!/usr/bin/env -iS python3",
        "#!/usr/bin/env --split-string=python3 -u",
        "#!/usr/bin/env -S -u HOME A=1 python3 -u",
        "#!/usr/bin/env -S -uHOME -- python3",
    ):
        script = tmp_path / "train.py"
        script.write_text(f"{shebang}\nprint()\n")
        script.chmod(0o755)
        assert command_interpreter(str(script), search) == (python3, ""), shebang
    script = tmp_path / "train.py"
    script.write_text("#!/usr/bin/env python3 -u\n")
    assert command_interpreter(str(script), search) == (
        None,
        f"{script} is a script run by python3 -u, not by Python",
    )
    assert env_command(["-S", "'unbalanced"]) is None and env_command(["-i"]) is None


def test_a_shebang_python_not_on_path_is_a_problem(tmp_path: Path) -> None:
    """`#!/usr/bin/env python3.99` with no python3.99 on PATH: a problem, never "no torch"."""
    script = tmp_path / "train.py"
    script.write_text("#!/usr/bin/env python3.99\n")
    script.chmod(0o755)
    assert command_interpreter(str(script), "/nonexistent") == (
        None,
        f"{script} is a script run by python3.99, which is not on PATH",
    )
    found_on = {"PATH": "/nonexistent"}
    found = read_job_python(JobPython(str(script), EXEC_COMMAND), found_on)
    assert found.problem and found.torch is None
    job = read_job_versions(NodeFS(), JobPython(str(script), EXEC_COMMAND), found_on, [])
    torch = job_torch(job, None)
    assert "no torch in" not in torch.account() and "could not be read" in torch.account()


def test_only_a_python_is_ever_started(tmp_path: Path) -> None:
    """--python /bin/true, a venv's torchrun, a wrapper script: refused, not started (a
    marker file shows it); a link named otherwise that leads to a python3 is one."""
    marker = tmp_path / "ran"
    wrapper = tmp_path / "bin" / "mytool"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\ntouch {marker}\n")
    wrapper.chmod(0o755)
    for named in ("/bin/true", str(wrapper)):
        found = read_job_python(JobPython(named, "--python"), ENVIRON)
        assert found.problem.endswith(": not started") and found.torch is None, named
    assert not marker.exists()
    python3 = tmp_path / "real" / "python3"
    python3.parent.mkdir()
    python3.write_text(f"#!/bin/sh\ntouch {marker}\nexit 3\n")
    python3.chmod(0o755)
    (tmp_path / "bin" / "py").symlink_to(python3)
    found = read_job_python(JobPython(str(tmp_path / "bin" / "py"), "--python"), ENVIRON)
    assert found.problem.startswith(f"{tmp_path / 'bin' / 'py'} exited 3") and marker.exists()


def test_a_named_pythons_gaps_are_not_filled_by_a_running_process(tmp_path: Path) -> None:
    """A named Python without torch or pip's NCCL (conda's or NGC's system libnccl): the
    job's versions are not known; a running process's are said as seen elsewhere, and the
    installed libnccl only named. Named but unreadable: the running process counts."""
    venv = tmp_path / "venv"
    fake_venv(venv, nccl=None)
    (venv / "lib" / "python3.11" / "site-packages" / "torch-2.8.0.dist-info").rename(
        venv / "lib" / "python3.11" / "site-packages" / "other"
    )
    running = ProcessLibraries(7001, "pid 7001 (python3)", "2.9.1", "here", "2.27.3", "there")
    python = read_job_python(JobPython(str(venv), "--python"), ENVIRON)
    assert python.problem == "" and python.torch is None and python.nccl is None
    job = JobVersions(python, (running,))
    installed = NcclLibraries((NcclLibrary((2, 21, 5), "/usr/lib/libnccl.so.2.21.5"),), ())
    torch, nccl = job_torch(job, None), job_nccl(job, installed)
    assert torch.known is None and nccl.known is None
    assert nccl.account() == (
        f"the job's NCCL is not known (no nvidia-nccl-cuXX in --python {venv}, its "
        "site-packages read without starting it (a venv); NCCL 2.27.3 in pid 7001 (python3), "
        "there: a running process, maybe not the job's; installed here, maybe not the job's: "
        "NCCL 2.21.5 (/usr/lib/libnccl.so.2.21.5))"
    )
    assert "torch 2.9.1 in pid 7001 (python3), here: a running process" in torch.account()
    unread = JobVersions(JobPythonReading("--python /x", problem="/x: missing"), (running,))
    assert job_torch(unread, None).known == (2, 9, 1) and job_nccl(unread, None).known == (2, 27, 3)
