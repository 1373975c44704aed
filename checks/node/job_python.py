"""The torch and NCCL of the Python a job will run, named by `--python` or found as
`nodecheck exec`'s command: read from that environment's package metadata, never by
importing torch.

Where the environment is a venv (`pyvenv.cfg` beside or above the interpreter: the venv
module's documentation, "How venvs work") without the system's site-packages, or a conda
environment (`conda-meta/`), its `lib/pythonX.Y/site-packages` is read as it lies, and
nothing is started. Anywhere else (the system's Python, a venv that includes the system's
site-packages) the interpreter is asked for its paths: one start-up with `-S`, so no
`site` module runs, and with it no `.pth` file, sitecustomize or usercustomize (Python docs,
the site module), bounded by INTERPRETER_TIMEOUT_S and INTERPRETER_OUTPUT_LIMIT, in the
calling environment (PYTHONPATH counts as it does for the job). Its `site.venv()` reads
`pyvenv.cfg` as `site.main()` would, so a venv's system site-packages are included.

The distributions are `torch` and pip's NCCL for torch, `nvidia-nccl-cuXX` (its library
is only `nvidia/nccl/lib/libnccl.so.2`: the version is the distribution's).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from nodecheck.checks.node.fs import ReadError, list_dir, read_prefix
from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.node.torch_package import find_distribution
from nodecheck.checks.record import record

INTERPRETER_TIMEOUT_S = 10.0
# The probe prints a few paths: 64 KiB is far past any sys.path.
INTERPRETER_OUTPUT_LIMIT = 64 << 10
# A script's first line, where its shebang is: the kernel reads at most BINPRM_BUF_SIZE,
# 256 bytes of it (include/uapi/linux/binfmts.h).
SHEBANG_LIMIT = 256
PYVENV_CFG_LIMIT = 64 << 10
PYTHON_NAME = LazyPattern(r"^python(\d+(\.\d+)?)?$")
LIB_PYTHON = LazyPattern(r"^python(\d+)\.(\d+)t?$")
NCCL_WHEEL = LazyPattern(r"^nvidia-nccl-cu\d+$")

# The interpreter's answer: its paths as the job will search them, no site module run.
PROBE = (
    "import json, site, sys\n"
    "if hasattr(site, 'venv'): site.venv(set())\n"
    "enable = site.ENABLE_USER_SITE\n"
    "if enable is None: enable = site.check_enableusersite()\n"
    "user = site.getusersitepackages() if enable else None\n"
    "print(json.dumps({'path': [p for p in sys.path if p], 'user': user,"
    " 'site': site.getsitepackages()}))\n"
)


@record
class JobPython:
    """The Python the job runs, as the user named it: `--python PATH` (an interpreter or
    an environment's folder), or exec's command (a name looked up on PATH, an
    interpreter, or a script whose shebang names one)."""

    path: str
    named_by: str  # "--python" or "exec's command"

    @property
    def from_command(self) -> bool:
        return self.named_by == EXEC_COMMAND


EXEC_COMMAND = "exec's command"


@record
class JobPythonReading:
    """What that environment holds: torch's and pip's NCCL's versions as its metadata
    says them (None: not installed there), how they were read, or why they could not be."""

    named: str  # "--python /opt/venv/bin/python"
    how: str = ""  # "its site-packages read without starting it (a venv)"
    torch: str | None = None
    nccl: str | None = None
    nccl_package: str = ""  # "nvidia-nccl-cu12"
    problem: str = ""  # why it could not be read: the versions are then unknown

    @property
    def origin(self) -> str:
        return f"{self.named}, {self.how}" if self.how else self.named


def is_python_name(path: str) -> bool:
    return PYTHON_NAME.match(os.path.basename(path)) is not None


def startable(interpreter: Path) -> bool:
    """Whether `interpreter` may be started to ask for its paths: only a Python, told by
    its name or the name of the file its links lead to (a venv's bin/python links to
    python3.X). Anything else (/bin/true, a venv's torchrun, a wrapper script) would run
    with the probe's arguments, doing whatever it does: never started."""
    return is_python_name(str(interpreter)) or is_python_name(os.path.realpath(interpreter))


def _on_path(name: str, search: str) -> Path | None:
    """`name` as execvp finds it on PATH (a name with a "/" as it is)."""
    if "/" in name:
        return Path(name)
    for folder in search.split(os.pathsep):
        candidate = Path(folder or ".", name)
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_shebang(first: bytes) -> list[str] | None:
    """The interpreter and its argument from a script's first line ("#!/usr/bin/env
    python3" -> ["/usr/bin/env", "python3"]); None without one. Linux passes all that
    follows the interpreter's name as one argument, unsplit (execve(2), "Interpreter
    scripts")."""
    if not first.startswith(b"#!"):
        return None
    line = first[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    return line.split(None, 1) if line else None


# env(1)'s options that take a value (GNU coreutils' env, "env invocation"): as a word of
# their own or joined to the option ("-uNAME", "--unset=NAME").
ENV_SHORT_WITH_VALUE = frozenset("uCS")
ENV_LONG_WITH_VALUE = frozenset({"--unset", "--chdir", "--split-string"})


def env_command(words: list[str]) -> str | None:
    """The command env(1) runs given `words`, as it parses them: its options skipped (-i,
    -0, -v, -u NAME, -C DIR, their long forms, the signal options), -S STRING split into
    words where it stands ("#!/usr/bin/env -S python3 -u"), NAME=VALUE assignments
    skipped; None where no command is left (env then prints the environment)."""
    pending = list(words)
    while pending:
        word = pending.pop(0)
        if word == "--":
            return pending[0] if pending else None
        if word.startswith("--"):
            name, equals, joined = word.partition("=")
            if name in ENV_LONG_WITH_VALUE:
                value = joined if equals else (pending.pop(0) if pending else "")
                if name == "--split-string":
                    pending[:0] = _split_string(value)
            continue
        if word.startswith("-"):
            # A cluster of flags ("-iv"), ended by the first option that takes a value.
            for at, letter in enumerate(word[1:], start=1):
                if letter in ENV_SHORT_WITH_VALUE:
                    value = word[at + 1 :] or (pending.pop(0) if pending else "")
                    if letter == "S":
                        pending[:0] = _split_string(value)
                    break
            continue
        if "=" in word:
            continue
        return word
    return None


def _split_string(text: str) -> list[str]:
    """-S's STRING as env splits it: at white space, quotes kept together; an unbalanced
    quote leaves nothing (env refuses it)."""
    import shlex  # only for a `#!/usr/bin/env -S` line: `check` and `tune` never pay for it

    try:
        return shlex.split(text)
    except ValueError:
        return []


def command_interpreter(command: str, search: str) -> tuple[Path | None, str]:
    """The Python interpreter exec's command runs: the command itself when it is one, or
    the interpreter its shebang names (torchrun's console script names the environment's
    own); (None, why) when it is not Python or the interpreter is not found."""
    found = _on_path(command, search)
    if found is None:
        return None, f"{command} is not on PATH"
    if is_python_name(str(found)):
        return found, ""
    try:
        shebang = parse_shebang(read_prefix(found, SHEBANG_LIMIT).data)
    except ReadError as err:
        return None, str(err)
    if shebang is None:
        return None, f"{command} is neither a Python interpreter nor a script run by one"
    interpreter, *argument = shebang
    if os.path.basename(interpreter) == "env":
        # "#!/usr/bin/env python3": env looks the name up on PATH, as here.
        name = env_command(argument)
        if name is None or not is_python_name(name):
            return None, f"{command} is a script run by {name or 'env'}, not by Python"
        looked_up = _on_path(name, search)
        if looked_up is None:
            return None, f"{command} is a script run by {name}, which is not on PATH"
        return looked_up, ""
    if not is_python_name(interpreter):
        return None, f"{command} is a script run by {interpreter}, not by Python"
    return Path(interpreter), ""


def environment_prefix(path: Path) -> Path | None:
    """The venv or conda environment `path` is (a folder) or whose bin/ it is in (an
    interpreter); None for anything else. A venv's interpreter is a symlink to its base
    Python: the venv is found beside the link, as CPython's getpath does, never after it."""
    folder = path if path.is_dir() else path.parent
    for prefix in (folder, folder.parent):
        if (prefix / "pyvenv.cfg").is_file() or (prefix / "conda-meta").is_dir():
            return prefix
    return None


def parse_pyvenv_cfg(text: str) -> dict[str, str]:
    """pyvenv.cfg's `key = value` lines, keys in lower case (the venv module's format)."""
    values = {}
    for line in text.splitlines():
        key, equals, value = line.partition("=")
        if equals:
            values[key.strip().lower()] = value.strip()
    return values


def _version_folder(names: list[str], version: str) -> str | None:
    """The lib/pythonX.Y folder of the environment's Python: the one whose X.Y is
    pyvenv.cfg's version where it says one, else the only one."""
    folders = {name: match.groups() for name in names if (match := LIB_PYTHON.match(name))}
    wanted = re.match(r"^(\d+)\.(\d+)", version)
    if wanted:
        return next((name for name, got in folders.items() if got == wanted.groups()), None)
    return next(iter(folders)) if len(folders) == 1 else None


def prefix_site_packages(prefix: Path) -> tuple[list[str] | None, str]:
    """The site-packages of a venv or conda environment, read without starting anything;
    (None, why) where only its interpreter can tell (the system's site-packages included,
    or several Python versions and none named)."""
    kind = "a conda environment"
    cfg = prefix / "pyvenv.cfg"
    values: dict[str, str] = {}
    if cfg.is_file():
        kind = "a venv"
        try:
            values = parse_pyvenv_cfg(
                read_prefix(cfg, PYVENV_CFG_LIMIT).data.decode("utf-8", "replace")
            )
        except ReadError as err:
            return None, str(err)
        if values.get("include-system-site-packages", "false").lower() == "true":
            return None, "a venv that includes the system's site-packages"
    try:
        names = list_dir(prefix / "lib")
    except ReadError as err:
        return None, str(err)
    folder = _version_folder(names, values.get("version", values.get("version_info", "")))
    if folder is None:
        return None, f"{kind} whose lib/ holds no single pythonX.Y"
    return [str(prefix / "lib" / folder / "site-packages")], kind


def ask_interpreter(
    interpreter: Path, environ: dict[str, str], timeout_s: float
) -> tuple[list[str], str]:
    """The interpreter's search path (sys.path, its user and system site-packages) from
    one `-S` start-up; ValueError with the reason when it does not answer."""
    import json

    from nodecheck.checks.node.slurm_state import SlurmStateError, run_bounded_command

    started = time.monotonic()
    argv = [str(interpreter), "-S", "-c", PROBE]
    try:
        status, out, err = run_bounded_command(argv, timeout_s, INTERPRETER_OUTPUT_LIMIT, environ)
    except SlurmStateError as problem:
        raise ValueError(str(problem)) from None
    spent = time.monotonic() - started
    if status != 0:
        last = (err.strip().splitlines() or ["no message"])[-1][:200]
        raise ValueError(f"{interpreter} exited {status}: {last}")
    try:
        answer = json.loads(out)
        path = [str(p) for p in answer["path"]]
        user = [str(answer["user"])] if answer.get("user") else []
        site = [str(p) for p in answer["site"]]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{interpreter} answered something other than its paths") from None
    how = f"asked the interpreter for its paths (one start-up with -S, {spent * 1000:.0f} ms)"
    return [*path, *user, *site], how


def _search_path(site: list[str], environ: dict[str, str]) -> list[str]:
    """PYTHONPATH's folders first, as Python puts them before site-packages."""
    extra = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return extra + site


def read_job_python(
    job: JobPython,
    environ: dict[str, str],
    timeout_s: float = INTERPRETER_TIMEOUT_S,
) -> JobPythonReading:
    """torch's and pip's NCCL's versions in the environment `job` names. Its path is one of
    this machine, as the shell that named it sees it (never under --rootfs): exec starts
    CMD here, and only an interpreter here can be asked."""
    named = f"{job.named_by} {job.path}"
    search = environ.get("PATH", os.defpath)
    if job.from_command:
        found, why = command_interpreter(job.path, search)
        if found is None:
            return JobPythonReading(named, problem=why)
        named = f"{named} ({found})" if str(found) != job.path else named
    else:
        found = Path(job.path)
        # A venv's python is a link to its base interpreter; the venv is read beside the
        # link, so the link alone is enough (the base is started only where it must be).
        if not found.exists() and not found.is_symlink():
            return JobPythonReading(named, problem=f"{found}: missing")
    prefix = environment_prefix(found)
    site, how = (None, "") if prefix is None else prefix_site_packages(prefix)
    if site is not None:
        how = f"its site-packages read without starting it ({how})"
        paths = _search_path(site, environ)
    elif found.is_dir():
        why = how or "no pyvenv.cfg or conda-meta/ there"
        return JobPythonReading(named, problem=f"{found}: not an environment to read ({why})")
    elif not startable(found):
        return JobPythonReading(
            named,
            problem=(
                f"{found} is not a Python interpreter (neither it nor the file it links to "
                "is named python, python3 or pythonX.Y): not started"
            ),
        )
    else:
        try:
            paths, how = ask_interpreter(found, environ, timeout_s)
        except ValueError as err:
            return JobPythonReading(named, problem=str(err))
    torch = find_distribution(lambda name: name == "torch", paths)
    nccl = find_distribution(lambda name: NCCL_WHEEL.match(name) is not None, paths)
    return JobPythonReading(
        named,
        how,
        None if torch is None else torch[1],
        None if nccl is None else nccl[1],
        "" if nccl is None else nccl[0],
    )
