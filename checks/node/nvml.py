"""Access to NVML (nvidia-ml-py, imported as `pynvml`) under a deadline.

NVML calls go into the kernel driver, and when a GPU falls off the bus they can
block for minutes (nvidia-smi stuck in D state: NVIDIA/gpu-monitoring-tools
#46). So no caller ever waits on NVML directly: each job runs on its own daemon
thread and the caller waits at most `deadline_s`. A job past its deadline is
abandoned, and its *key* (the job's name: "GPU 2", "nvmlInit", "listing the
GPUs") is stuck until that thread comes back. While it is, a new
job with that key fails at once with `NvmlHungError` instead of stacking another
thread behind the stuck call; jobs with other keys (the other GPUs) run as usual.
So one GPU that stopped answering costs only that GPU's results, and the GPU is
read again as soon as its stuck call returns.

pynvml is imported on first use, so `nodecheck --help` never pays for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import math
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from nodecheck.checks.config import DEFAULT_NVML_TIMEOUT_S
from nodecheck.checks.record import record

T = TypeVar("T")

# nvmlReturn_t values (nvml.h) that mean "this GPU is gone until a reset".
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
LOST_CODES = frozenset({NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED})
# ... and "this query does not exist on this GPU or driver".
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
ABSENT_CODES = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18

DEFAULT_DEADLINE_S = DEFAULT_NVML_TIMEOUT_S


class NvmlUnavailableError(Exception):
    """NVML cannot be used on this node at all; `kind` says why, for judging."""

    LIBRARY_MISSING = "library_missing"
    DRIVER_NOT_LOADED = "driver_not_loaded"
    VERSION_MISMATCH = "version_mismatch"
    NO_PERMISSION = "no_permission"
    INIT_FAILED = "init_failed"
    QUERY_FAILED = "query_failed"

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class NvmlHungError(Exception):
    """NVML did not answer within the deadline."""

    def __init__(self, deadline_s: float, what: str) -> None:
        super().__init__(f"NVML did not answer in {deadline_s:g} s ({what})")
        self.deadline_s = deadline_s


def valid_deadline(deadline_s: float) -> float:
    """`deadline_s` if it is a finite number of seconds above zero, else ValueError.

    NaN would make every wait return at once (or never, by platform), infinity
    would wait for ever on a stuck driver: neither is a deadline.
    """
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, int | float):
        raise ValueError(f"NVML deadline must be a number of seconds, not {deadline_s!r}")
    if not math.isfinite(deadline_s) or deadline_s <= 0:
        raise ValueError(f"NVML deadline must be finite and above 0 s, not {deadline_s!r}")
    return float(deadline_s)


def error_code(err: BaseException) -> int | None:
    """The nvmlReturn_t of a pynvml.NVMLError, None for anything else."""
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def describe_error(err: BaseException) -> str:
    """pynvml's text for an NVML error ("GPU is lost"), or the exception's."""
    text = str(err)
    return text if text else type(err).__name__


@record(frozen=False)
class _Job:
    done: threading.Event
    value: object = None
    failure: BaseException | None = None


@record
class _StuckCall:
    thread: threading.Thread
    since: float  # time.monotonic() when the call started
    label: str  # what the call was doing ("GPU 2 at 0000:3a:00.0")


class NvmlSession:
    """One NVML initialisation, shared by every GPU read of a process.

    `library_path` loads NVML from a given file instead of the system's
    `libnvidia-ml.so.1` (a driver mounted somewhere unusual; the fake driver in
    tests). Thread-safe; `close()` shuts NVML down when nothing is stuck in it.
    """

    def __init__(
        self, *, deadline_s: float = DEFAULT_DEADLINE_S, library_path: str | None = None
    ) -> None:
        self.deadline_s = valid_deadline(deadline_s)
        self.library_path = library_path
        self._lock = threading.Lock()
        self._init_lock = threading.Lock()
        self._initialized = False
        self._stuck: dict[str, list[_StuckCall]] = {}
        self._bus_ids: dict[int, str] = {}

    # -- running jobs under the deadline ----------------------------------

    def _alive_stuck(self) -> dict[str, list[_StuckCall]]:
        """The stuck calls still in the driver, by key; forgets those that returned."""
        with self._lock:
            self._stuck = {
                key: alive
                for key, calls in self._stuck.items()
                if (alive := [call for call in calls if call.thread.is_alive()])
            }
            return dict(self._stuck)

    @property
    def wedged(self) -> bool:
        """Whether any NVML call is still stuck (then nvmlShutdown would hang too)."""
        return bool(self._alive_stuck())

    def stuck_keys(self) -> set[str]:
        """The job keys whose last call past its deadline has not returned yet."""
        return set(self._alive_stuck())

    def remember_bus_id(self, index: int, bus_id: str) -> None:
        """Record the bus id NVML reported for GPU `index` in the current session.

        nvml.h promises no consistency of the index order between reboots
        (nvmlDeviceGetHandleByIndex_v2), but NVML enumerates once per nvmlInit, so
        within one session an index stays the same GPU: a GPU whose calls are
        stuck can still be named by the bus id it had.
        """
        with self._lock:
            self._bus_ids[index] = bus_id

    def known_bus_id(self, index: int) -> str | None:
        """The bus id GPU `index` last reported in the current session, None if never."""
        with self._lock:
            return self._bus_ids.get(index)

    def run(self, job: Callable[[], T], what: str, deadline_s: float | None = None) -> T:
        """Run `job` on its own thread; NvmlHungError when it takes longer than the deadline,
        or at once when the previous job named `what` is still stuck."""
        outcome = self.run_many({what: job}, deadline_s)[what]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def run_many(
        self,
        jobs: Mapping[str, Callable[[], T]],
        deadline_s: float | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, T | BaseException]:
        """Run jobs in parallel, each under the same deadline; a hung one gives NvmlHungError.

        Used to read every GPU at once: one GPU that stopped answering costs
        the pass one deadline, not one deadline per GPU. A job whose key is
        still stuck from an earlier call is answered at once (no new thread),
        naming the stuck call and how long it has been stuck; the other jobs
        run. `labels` says what a job does, for the errors ("GPU 2 at
        0000:3a:00.0" for the key "GPU 2"); a job without one is named by its key.
        """
        deadline = self.deadline_s if deadline_s is None else valid_deadline(deadline_s)
        stuck = self._alive_stuck()
        now = time.monotonic()
        results: dict[str, T | BaseException] = {}
        outcomes: dict[str, _Job] = {}
        threads: dict[str, tuple[threading.Thread, float]] = {}
        for name, job in jobs.items():
            if name in stuck:
                oldest = min(stuck[name], key=lambda call: call.since)
                results[name] = NvmlHungError(
                    deadline,
                    f"{oldest.label}: its call of {now - oldest.since:.0f} s ago is still stuck",
                )
                continue
            outcome = outcomes[name] = _Job(threading.Event())

            def work(job: Callable[[], T] = job, outcome: _Job = outcome) -> None:
                try:
                    outcome.value = job()
                except BaseException as err:
                    outcome.failure = err
                finally:
                    outcome.done.set()

            thread = threading.Thread(target=work, name=f"nvml-{name}", daemon=True)
            threads[name] = (thread, time.monotonic())
            thread.start()
        end = time.monotonic() + deadline
        for name, outcome in outcomes.items():
            if not outcome.done.wait(max(end - time.monotonic(), 0.0)):
                thread, started = threads[name]
                label = name if labels is None else labels.get(name, name)
                with self._lock:
                    self._stuck.setdefault(name, []).append(_StuckCall(thread, started, label))
                results[name] = NvmlHungError(deadline, label)
            elif outcome.failure is not None:
                results[name] = outcome.failure
            else:
                results[name] = outcome.value  # type: ignore[assignment]
        return {name: results[name] for name in jobs}

    # -- NVML itself -------------------------------------------------------

    def module(self) -> Any:
        """pynvml, initialised once; NvmlUnavailableError or NvmlHungError when it cannot be.

        Callers that arrive while another is initialising wait for that one
        (up to the deadline) instead of initialising again.
        """
        try:
            pynvml = import_pynvml()
        except ImportError as err:
            raise NvmlUnavailableError(
                NvmlUnavailableError.LIBRARY_MISSING, f"nvidia-ml-py is not installed ({err})"
            ) from err
        if self._initialized:
            return pynvml
        if not self._init_lock.acquire(timeout=self.deadline_s):
            raise NvmlHungError(self.deadline_s, "nvmlInit, started by another caller")
        try:
            if not self._initialized:
                self.run(lambda: self._init(pynvml), "nvmlInit")
        finally:
            self._init_lock.release()
        return pynvml

    def _init(self, pynvml: Any) -> None:
        chosen = None if self.library_path is None else _load_library(self.library_path)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise _unavailable(err) from err
        # pynvml loads "libnvidia-ml.so.1" once per process; the dynamic loader
        # hands back the library we loaded only if none was loaded before it.
        loaded = getattr(pynvml, "nvmlLib", None)
        if chosen is not None and getattr(loaded, "_handle", None) != chosen._handle:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            raise NvmlUnavailableError(
                NvmlUnavailableError.INIT_FAILED,
                f"cannot use {self.library_path}: another NVML library is already loaded "
                "in this process",
            )
        # Set here, not by the caller: an nvmlInit that finishes after its
        # deadline still counts, so it is never initialised twice.
        with self._lock:
            self._initialized = True

    def close(self) -> str:
        """Shut NVML down, unless a call is stuck in it (then shutdown would hang too);
        what became of it: "closed", "not open", "left open: <why>"."""
        with self._lock:
            initialized, self._initialized = self._initialized, False
            self._bus_ids.clear()  # the next nvmlInit may number the GPUs differently
        if not initialized:
            return "not open"
        if self.wedged:
            return "left open: a call is stuck in it"
        import pynvml

        try:
            self.run(pynvml.nvmlShutdown, "nvmlShutdown")
        except (NvmlHungError, pynvml.NVMLError) as err:
            return f"left open: nvmlShutdown: {describe_error(err)}"
        return "closed"


_IMPORTING = threading.Lock()


def _find_library_when_called(name: str) -> str | None:
    real: Any = importlib.import_module("ctypes.util")
    return real.find_library(name)  # type: ignore[no-any-return]


def import_pynvml() -> Any:
    """pynvml, imported without ctypes.util where nothing has imported that yet.

    pynvml (nvidia-ml-py 11 to 13, pynvml.py) begins `from ctypes.util import
    find_library` and never calls it: it opens the library by name, "libnvidia-ml.so.1"
    on Linux. ctypes.util imports subprocess, shutil and tempfile, and with them bz2, lzma
    and random: as much as pynvml itself, a twentieth of `nodecheck check`. So for the
    import alone, "ctypes.util" names a stand-in whose find_library imports the real
    module when called; afterwards the name is taken out of sys.modules again, so any
    later `import ctypes.util` gets the real one."""
    with _IMPORTING:
        if "pynvml" in sys.modules or "ctypes.util" in sys.modules:
            import pynvml

            return pynvml
        stand_in = types.ModuleType("ctypes.util")
        stand_in.find_library = _find_library_when_called  # type: ignore[attr-defined]
        sys.modules["ctypes.util"] = stand_in
        try:
            import pynvml
        finally:
            if sys.modules.get("ctypes.util") is stand_in:
                del sys.modules["ctypes.util"]
        return pynvml


def _load_library(path: str) -> ctypes.CDLL:
    """Load NVML from `path` so that pynvml's dlopen("libnvidia-ml.so.1") finds it."""
    try:
        library = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        raise NvmlUnavailableError(
            NvmlUnavailableError.LIBRARY_MISSING, f"NVML library not found: {err}"
        ) from err
    if not hasattr(library, "nvmlInit_v2"):
        raise NvmlUnavailableError(
            NvmlUnavailableError.LIBRARY_MISSING, f"{path} is not an NVML library (no nvmlInit_v2)"
        )
    return library


def _unavailable(err: BaseException) -> NvmlUnavailableError:
    code = error_code(err)
    text = describe_error(err)
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return NvmlUnavailableError(NvmlUnavailableError.LIBRARY_MISSING, "NVML library not found")
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return NvmlUnavailableError(
            NvmlUnavailableError.DRIVER_NOT_LOADED, "the NVIDIA kernel driver is not loaded"
        )
    if code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return NvmlUnavailableError(
            NvmlUnavailableError.VERSION_MISMATCH,
            "the NVML library and the loaded kernel driver are different versions",
        )
    if code == NVML_ERROR_NO_PERMISSION:
        return NvmlUnavailableError(
            NvmlUnavailableError.NO_PERMISSION,
            "no permission to open the GPU devices (/dev/nvidia*)",
        )
    return NvmlUnavailableError(NvmlUnavailableError.INIT_FAILED, f"nvmlInit failed: {text}")
