"""This process's cpuset, found where the node mounts it: the parsers on literal kernel text,
then read_cpuset on trees holding each form the kernel has served (cgroup2 where Slurm
mounts it, cgroup v1 in its legacy places and forms, a container's mount root)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodecheck.checks.node.cgroup import (
    CpusetReading,
    Mount,
    parse_mountinfo,
    parse_proc_cgroup,
    parse_proc_cpuset,
    parse_proc_mounts,
    read_cpuset,
    unescape_mount_field,
)
from nodecheck.checks.node.fs import NodeFS

# --- parsers ---------------------------------------------------------------------------

# As Documentation/filesystems/proc.rst prints it, then a Slurm node's cgroup lines: an
# optional field, none, two; a v1 hierarchy holding two controllers.
MOUNTINFO = (
    "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
    "25 1 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "41 25 0:38 / /cgroup/unified rw,relatime - cgroup2 none rw,nsdelegate\n"
    "42 25 0:39 / /cgroup/cpu,cpuset rw,relatime shared:9 master:3 - cgroup none "
    "rw,cpu,cpuset\n"
    "43 25 0:40 /docker/0123abcd /sys/fs/cgroup/cpuset ro,nosuid - cgroup cgroup rw,cpuset\n"
    "44 25 0:41 / /mnt/with\\040space\\134and\\011tab rw - tmpfs tmpfs rw\n"
)


def test_mountinfo_fields() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert [(m.mount_point, m.root, m.fs_type) for m in mounts] == [
        ("/mnt/parent", "/mnt1", "ext3"),
        ("/sys", "/", "sysfs"),
        ("/cgroup/unified", "/", "cgroup2"),
        ("/cgroup/cpu,cpuset", "/", "cgroup"),
        ("/sys/fs/cgroup/cpuset", "/docker/0123abcd", "cgroup"),
        ("/mnt/with space\\and\ttab", "/", "tmpfs"),
    ]
    # Per-mount and superblock options together: the controllers are superblock options.
    assert {"cpu", "cpuset", "relatime"} <= mounts[3].options
    assert "nsdelegate" in mounts[2].options


def test_mountinfo_lines_without_the_separator_are_skipped() -> None:
    text = "1 2 0:1 / /a rw\n" + "garbage\n" + "\n" + MOUNTINFO.splitlines()[2] + "\n"
    assert [m.mount_point for m in parse_mountinfo(text)] == ["/cgroup/unified"]


def test_proc_mounts_fields() -> None:
    text = (
        "none /cgroup/unified cgroup2 rw 0 0\n"
        "cpuset /dev/cpuset cgroup rw,relatime,cpuset,noprefix,release_agent=/sbin/x 0 0\n"
        "short line\n"
    )
    assert parse_proc_mounts(text) == [
        Mount("/cgroup/unified", "/", "cgroup2", frozenset({"rw"})),
        Mount(
            "/dev/cpuset",
            "/",
            "cgroup",
            frozenset({"rw", "relatime", "cpuset", "noprefix", "release_agent=/sbin/x"}),
        ),
    ]


def test_octal_escapes() -> None:
    assert unescape_mount_field(r"/a\040b\012c\134\011") == "/a b\nc\\\t"
    assert unescape_mount_field(r"/no\escape\08") == r"/no\escape\08"


def test_proc_cgroup_with_combined_controllers() -> None:
    text = "12:cpu,cpuset:/slurm/uid_1000/job_7/step_0\n4:memory:/slurm\n0::/\n"
    assert parse_proc_cgroup(text) == {
        "cpu": "/slurm/uid_1000/job_7/step_0",
        "cpuset": "/slurm/uid_1000/job_7/step_0",
        "memory": "/slurm",
        "": "/",
    }


def test_proc_cpuset() -> None:
    assert parse_proc_cpuset("/uid_2008/job_15389/step_0\n") == "/uid_2008/job_15389/step_0"
    assert parse_proc_cpuset("/\n") == "/"
    assert parse_proc_cpuset("") is None


# --- trees ---------------------------------------------------------------------------


def cgroup_node(
    root: Path,
    *,
    mountinfo: str | None = None,
    proc_mounts: str | None = None,
    proc_cgroup: str | None = None,
    proc_cpuset: str | None = None,
    files: dict[str, str] | None = None,
) -> NodeFS:
    """A node tree with these procfs files and host files (absolute paths: /sys/... under
    the sysfs root, anything else under the root filesystem), and 8 possible CPUs."""
    fs = NodeFS(sysfs=root / "sys", procfs=root / "proc", rootfs=root)
    proc_files = {
        "self/mountinfo": mountinfo,
        "mounts": proc_mounts,
        "self/cgroup": proc_cgroup,
        "self/cpuset": proc_cpuset,
    }
    host_files = {"/sys/devices/system/cpu/possible": "0-7\n", **(files or {})}
    for relative, text in proc_files.items():
        if text is not None:
            (root / "proc" / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / "proc" / relative).write_text(text)
    for absolute, text in host_files.items():
        path = root / absolute.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return fs


def mountinfo_line(mount_point: str, fs_type: str, super_options: str, root: str = "/") -> str:
    escaped = mount_point.replace(" ", "\\040")
    return f"41 25 0:38 {root} {escaped} rw,relatime - {fs_type} none {super_options}\n"


def test_cgroup2_mounted_where_slurm_mounts_it(tmp_path: Path) -> None:
    """cgroup2 at /cgroup/unified (as on a real Slurm node), and a decoy at /sys/fs/cgroup
    that a reader assuming the systemd place would take."""
    fs = cgroup_node(
        tmp_path,
        mountinfo=mountinfo_line("/cgroup/unified", "cgroup2", "rw"),
        proc_cgroup="0::/uid_2008/job_15389/step_0\n",
        files={
            "/cgroup/unified/cgroup.controllers": "cpu memory cpuset pids\n",
            "/cgroup/unified/uid_2008/job_15389/step_0/cpuset.cpus.effective": "0-5\n",
            "/sys/fs/cgroup/cpuset.cpus.effective": "0-7\n",
            "/sys/fs/cgroup/uid_2008/job_15389/step_0/cpuset.cpus.effective": "0-7\n",
        },
    )
    reading = read_cpuset(fs)
    assert (reading.cpus, reading.error) == (frozenset(range(6)), "")
    assert reading.source.endswith("cgroup/unified/uid_2008/job_15389/step_0/cpuset.cpus.effective")


def test_cgroup2_without_the_cpuset_controller_limits_nothing(tmp_path: Path) -> None:
    fs = cgroup_node(
        tmp_path,
        mountinfo=mountinfo_line("/sys/fs/cgroup", "cgroup2", "rw"),
        proc_cgroup="0::/user.slice\n",
        files={"/sys/fs/cgroup/cgroup.controllers": "cpu io memory pids\n"},
    )
    assert read_cpuset(fs) == CpusetReading(None)


@pytest.mark.parametrize(
    ("mount_point", "super_options", "proc_cgroup", "name"),
    [
        ("/sys/fs/cgroup/cpuset", "rw,cpuset", "7:cpuset:/slurm/job_7\n", "cpuset.effective_cpus"),
        ("/cgroup/cpuset", "rw,cpuset", "7:cpuset:/slurm/job_7\n", "cpuset.effective_cpus"),
        ("/cgroup/cpu,cpuset", "rw,cpu,cpuset", "3:cpu,cpuset:/slurm/job_7\n", "cpuset.cpus"),
        ("/dev/cpuset", "rw,cpuset,noprefix", "7:cpuset:/slurm/job_7\n", "cpus"),
        ("/mnt/cg roups", "rw,cpuset", "7:cpuset:/slurm/job_7\n", "cpuset.effective_cpus"),
    ],
    ids=["sys-fs-cgroup", "cgroup-cpuset", "with-cpu", "dev-cpuset-noprefix", "escaped"],
)
def test_cgroup_v1_cpuset_in_its_legacy_places(
    tmp_path: Path, mount_point: str, super_options: str, proc_cgroup: str, name: str
) -> None:
    fs = cgroup_node(
        tmp_path,
        mountinfo=mountinfo_line(mount_point, "cgroup", super_options),
        proc_cgroup=proc_cgroup,
        files={
            f"{mount_point}/slurm/job_7/{name}": "2-3,6\n",
            f"{mount_point}/{name}": "0-7\n",
        },
    )
    reading = read_cpuset(fs)
    assert (reading.cpus, reading.error) == (frozenset({2, 3, 6}), "")
    assert reading.source.endswith(f"/slurm/job_7/{name}")


def test_old_cpuset_filesystem_named_by_proc_self_cpuset(tmp_path: Path) -> None:
    """`mount -t cpuset` on a kernel without /proc/self/cgroup: the task's cpuset path is
    /proc/self/cpuset, the files have no prefix, and there is no mountinfo either."""
    fs = cgroup_node(
        tmp_path,
        proc_mounts="none /dev/cpuset cpuset rw 0 0\n",
        proc_cpuset="/prout\n",
        files={"/dev/cpuset/cpus": "0-7\n", "/dev/cpuset/prout/cpus": "2-5,7\n"},
    )
    reading = read_cpuset(fs)
    assert (reading.cpus, reading.error) == (frozenset({2, 3, 4, 5, 7}), "")
    assert any("/proc/mounts" in note for note in reading.notes)
    assert any("/proc/self/cpuset" in note for note in reading.notes)
    assert any("no effective_cpus" in note for note in reading.notes)


def test_missing_effective_cpus_and_an_empty_list_walk_up(tmp_path: Path) -> None:
    """An old kernel: no cpuset.effective_cpus, so cpuset.cpus; the task's own cgroup has
    an empty list (a child cpuset never configured), so its parent's holds."""
    fs = cgroup_node(
        tmp_path,
        mountinfo=mountinfo_line("/sys/fs/cgroup/cpuset", "cgroup", "rw,cpuset"),
        proc_cgroup="7:cpuset:/slurm/job_7/step_0\n",
        files={
            "/sys/fs/cgroup/cpuset/cpuset.cpus": "0-7\n",
            "/sys/fs/cgroup/cpuset/slurm/job_7/cpuset.cpus": "4-7\n",
            "/sys/fs/cgroup/cpuset/slurm/job_7/step_0/cpuset.cpus": "\n",
        },
    )
    reading = read_cpuset(fs)
    assert (reading.cpus, reading.error) == (frozenset(range(4, 8)), "")
    assert reading.source.endswith("/slurm/job_7/cpuset.cpus")
    assert any("nearest ancestor" in note for note in reading.notes)


def test_container_mount_root(tmp_path: Path) -> None:
    """A container bind-mounts its own cgroup (root /docker/ID) at /sys/fs/cgroup/cpuset;
    /proc/self/cgroup names /docker/ID: the mount point itself holds its cpuset, not the
    nested cgroup of the same name below it (docker in docker)."""
    fs = cgroup_node(
        tmp_path,
        mountinfo=mountinfo_line(
            "/sys/fs/cgroup/cpuset", "cgroup", "rw,cpuset", root="/docker/0123abcd"
        ),
        proc_cgroup="7:cpuset:/docker/0123abcd\n",
        files={
            "/sys/fs/cgroup/cpuset/cpuset.effective_cpus": "1,3\n",
            "/sys/fs/cgroup/cpuset/docker/0123abcd/cpuset.effective_cpus": "3\n",
        },
    )
    reading = read_cpuset(fs)
    assert (reading.cpus, reading.error) == (frozenset({1, 3}), "")


def test_cgroup_outside_the_mount_root_is_an_error(tmp_path: Path) -> None:
    fs = cgroup_node(
        tmp_path,
        mountinfo=mountinfo_line("/sys/fs/cgroup", "cgroup2", "rw", root="/kubepods/pod1"),
        proc_cgroup="0::/system.slice/other\n",
        files={
            "/sys/fs/cgroup/cgroup.controllers": "cpuset\n",
            "/sys/fs/cgroup/cpuset.cpus.effective": "0-7\n",
        },
    )
    reading = read_cpuset(fs)
    assert reading.cpus is None and "lies outside every mount of its hierarchy" in reading.error


@pytest.mark.parametrize(
    ("content", "words"),
    [("0-2147483647\n", "not a CPU list the kernel prints"), ("zero\n", "not a CPU list")],
)
def test_a_cpuset_the_kernel_cannot_hold_is_an_error(
    tmp_path: Path, content: str, words: str
) -> None:
    fs = cgroup_node(
        tmp_path,
        mountinfo=mountinfo_line("/sys/fs/cgroup", "cgroup2", "rw"),
        proc_cgroup="0::/job\n",
        files={
            "/sys/fs/cgroup/cgroup.controllers": "cpuset\n",
            "/sys/fs/cgroup/job/cpuset.cpus.effective": content,
        },
    )
    reading = read_cpuset(fs)
    assert reading.cpus is None and words in reading.error
    assert "job/cpuset.cpus.effective" in reading.error


def test_a_cpuset_named_but_not_mounted_is_an_error(tmp_path: Path) -> None:
    fs = cgroup_node(
        tmp_path,
        mountinfo=mountinfo_line("/sys", "sysfs", "rw"),
        proc_cgroup="7:cpuset:/slurm/job_7\n",
    )
    reading = read_cpuset(fs)
    assert reading.cpus is None and "no cpuset hierarchy is mounted here" in reading.error


def test_no_cgroup_file_limits_nothing(tmp_path: Path) -> None:
    """A replica or captured tree without /proc/self: nothing to read, no error."""
    assert read_cpuset(cgroup_node(tmp_path)) == CpusetReading(None)


def test_the_memory_nodes_are_read_beside_the_cpus(tmp_path: Path) -> None:
    """cpuset.mems too (hwloc's 16amd64-4n4c-cgroup-distance-merge allows CPUs of node 0
    but memory of nodes 2-3): the old cpuset form's `mems` where there is no
    `effective_mems`, said; a cgroup2 step's `cpuset.mems.effective`; and none read where
    the cgroup has no memory list (no limit, never a guess)."""
    old = cgroup_node(
        tmp_path / "old",
        proc_mounts="none /dev/cpuset cpuset rw 0 0\n",
        proc_cpuset="/job\n",
        files={"/dev/cpuset/job/cpus": "0-3\n", "/dev/cpuset/job/mems": "2-3\n"},
    )
    reading = read_cpuset(old)
    assert (reading.cpus, reading.mems) == (frozenset(range(4)), frozenset({2, 3}))
    assert reading.mems_source.endswith("/dev/cpuset/job/mems")
    assert any("no effective_mems" in note for note in reading.notes)
    step = cgroup_node(
        tmp_path / "v2",
        mountinfo=mountinfo_line("/cgroup/unified", "cgroup2", "rw"),
        proc_cgroup="0::/job/step_0\n",
        files={
            "/cgroup/unified/cgroup.controllers": "cpuset cpu memory\n",
            "/cgroup/unified/job/step_0/cpuset.cpus.effective": "4-7\n",
            "/cgroup/unified/job/step_0/cpuset.mems.effective": "1\n",
        },
    )
    assert read_cpuset(step).mems == frozenset({1})
    bare = cgroup_node(
        tmp_path / "bare",
        proc_mounts="none /dev/cpuset cpuset rw 0 0\n",
        proc_cpuset="/job\n",
        files={"/dev/cpuset/job/cpus": "0-3\n"},
    )
    assert read_cpuset(bare).mems is None and read_cpuset(bare).cpus == frozenset(range(4))
