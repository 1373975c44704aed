"""Which torch and NCCL versions the job's settings are judged by, and where each came from.

In order of how surely it is the job's:

1. the Python the user named (`tune --python`, or `exec`'s command): the job's by
   definition; once it is read, what it lacks is not known, and nothing below is taken
   in its place (a running process may be another user's job, and under `exec` whether
   rank N sees rank 0's started is a race);
2. where none was named, or it could not be read: a running GPU process's mapped
   libraries, a job on this node now;
3. nodecheck's own Python (`torch_version`) and the NCCL libraries installed on the node
   (`nccl_library`): what is here, which the job runs only if it runs this Python or
   links that library. These are said, but a setting that depends on the version is
   then chosen as for an unknown one.

A version the job runs is `the_jobs`; `describe()` names it with its origin, for every
recommendation and note that rests on it (the tune JSON carries the same).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from nodecheck.checks.record import record

if TYPE_CHECKING:
    # Types only: a rule never imports the readers (`check` pays for none it does not run).
    from nodecheck.checks.node.job_versions import JobVersions
    from nodecheck.checks.node.nccl_library import NcclLibraries
    from nodecheck.checks.node.torch_package import TorchVersion
    from nodecheck.checks.node.variables import Source

NODECHECK_PYTHON = "nodecheck's own Python"
# A running GPU process beside a named Python: maybe another user's job, or (under exec)
# another rank's that this rank may or may not see started yet.
RUNNING_ELSEWHERE = "a running process, maybe not the job's"


def parse_release(text: str) -> tuple[int, ...] | None:
    """ "2.9.1+cu128" -> (2, 9, 1); "2.21.5" -> (2, 21, 5); None for no leading number."""
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


@record
class VersionEvidence:
    """A version as read ("2.8.0"), where from, and whether that source is the job's.
    `text` "" when nothing was read; `known` only for a version the job runs."""

    project: str  # "torch" or "NCCL"
    text: str = ""
    origin: str = ""
    the_jobs: bool = False
    # What was read elsewhere that may not be the job's ("torch 2.13.0+cpu in nodecheck's
    # own Python"), said beside an unknown version.
    elsewhere: tuple[str, ...] = ()

    @property
    def release(self) -> tuple[int, ...] | None:
        return parse_release(self.text) if self.text else None

    @property
    def known(self) -> tuple[int, ...] | None:
        """The job's version as numbers; None when the job's is not known."""
        return self.release if self.the_jobs else None

    def at_least(self, since: tuple[int, ...]) -> bool | None:
        """Whether the job's version is `since` or later; None when it is not known."""
        known = self.known
        return None if known is None else known[: len(since)] >= since

    def describe(self) -> str:
        """ "torch 2.8.0 (from --python /opt/venv/bin/python, its site-packages read without
        starting it)", or "the job's torch is not known"."""
        if self.known is not None:
            return f"{self.project} {self.text} (from {self.origin})"
        return f"the job's {self.project} is not known"

    def account(self) -> str:
        """describe(), with what was read elsewhere where the job's is not known."""
        seen = "; ".join(self.elsewhere)
        return self.describe() + (f" ({seen})" if seen and self.known is None else "")


def _named_and_read(job: JobVersions | None) -> bool:
    """Whether a Python was named (--python, or exec's command) and its environment read:
    what it lacks the job lacks, whatever else runs here."""
    return job is not None and job.python is not None and not job.python.problem


def _from_running(
    job: JobVersions | None, project: str, elsewhere: list[str]
) -> VersionEvidence | None:
    """The first running GPU process's `project` ("torch" or "NCCL"): the job's where no
    named Python was read; else only added to `elsewhere`, and None."""
    for process in () if job is None else job.processes:
        if project == "torch":
            text, where = process.torch, process.torch_where
        else:
            text, where = process.nccl, process.nccl_where
        if text is None:
            continue
        origin = f"{process.label}, {where}"
        if not _named_and_read(job):
            return VersionEvidence(project, text, origin, True)
        elsewhere.append(f"{project} {text} in {origin}: {RUNNING_ELSEWHERE}")
        return None
    return None


def job_torch(job: JobVersions | None, own: TorchVersion | None) -> VersionEvidence:
    """The job's torch: the named Python's, else (none named, or it could not be read) a
    running process's; nodecheck's own is only said."""
    elsewhere: list[str] = []
    if job is not None and job.python is not None:
        python = job.python
        if python.problem:
            elsewhere.append(f"{python.named} could not be read: {python.problem}")
        elif python.torch is not None:
            return VersionEvidence("torch", python.torch, python.origin, True)
        else:
            elsewhere.append(f"no torch in {python.origin}")
    running = _from_running(job, "torch", elsewhere)
    if running is not None:
        return running
    if own is not None and own.text:
        elsewhere.append(
            f"torch {own.text} is in {NODECHECK_PYTHON}, which the job may not run: "
            "--python names the job's"
        )
    elif job is None or job.python is None:
        elsewhere.append("--python names the job's Python")
    return VersionEvidence("torch", elsewhere=tuple(elsewhere))


def job_nccl(job: JobVersions | None, installed: NcclLibraries | None) -> VersionEvidence:
    """The job's NCCL: pip's NCCL in the named Python, else (none named, or it could not
    be read) a running process's mapped libnccl; the libraries installed on the node are
    only said (a named Python without pip's NCCL may load the system's libnccl, or one
    linked into torch: which, is not known)."""
    elsewhere: list[str] = []
    if job is not None and job.python is not None:
        python = job.python
        if not python.problem and python.nccl is not None:
            origin = f"{python.nccl_package} in {python.origin}"
            return VersionEvidence("NCCL", python.nccl, origin, True)
        if not python.problem:
            elsewhere.append(f"no nvidia-nccl-cuXX in {python.origin}")
    running = _from_running(job, "NCCL", elsewhere)
    if running is not None:
        return running
    if installed is not None and installed.found:
        found = ", ".join(library.text for library in installed.found)
        elsewhere.append(f"installed here, maybe not the job's: {found}")
    return VersionEvidence("NCCL", elsewhere=tuple(elsewhere))


def process_torch(job: JobVersions | None, pid: int) -> VersionEvidence | None:
    """The torch a running GPU process has loaded, where it was read."""
    for process in () if job is None else job.processes:
        if process.pid == pid and process.torch is not None:
            return VersionEvidence(
                "torch", process.torch, f"{process.label}, {process.torch_where}", True
            )
    return None


@record
class JobTorch:
    """The torch each setting's reader runs: for a running process's environment, its own
    where it was read, else the running job's (the first process read); for any other
    source (the calling environment, a file), the job's."""

    job: VersionEvidence
    versions: JobVersions | None = None

    def for_source(self, source: Source) -> VersionEvidence:
        if source.kind != "process" or source.pid is None:
            return self.job
        own = process_torch(self.versions, source.pid)
        if own is not None:
            return own
        running = () if self.versions is None else self.versions.processes
        first = next((p.pid for p in running if p.torch is not None), None)
        found = None if first is None else process_torch(self.versions, first)
        return VersionEvidence("torch") if found is None else found


UNKNOWN_TORCH = JobTorch(VersionEvidence("torch"))
