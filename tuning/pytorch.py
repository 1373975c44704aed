"""PyTorch and CUDA settings: GPU numbering, the caching allocator, CPU threads and the
DataLoader, per docs/hardware.md §6 and the training performance chapter of Stas Bekman's
"Machine Learning Engineering" open book (github.com/stas00/ml-engineering,
training/performance/README.md: "Memory fragmentation", "DataLoader").

The job's torch version (checks/rules/job_versions.py: the Python named with --python or
exec's command, else a running job's, read from package metadata, never by importing
torch) decides the renamed variables' names and the allocator options' limits; where it is
not known, both names of each renamed variable are set, and said.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from nodecheck.checks.node.inventory import Inventory
from nodecheck.checks.node.variables import parse_count
from nodecheck.checks.record import record
from nodecheck.checks.rules.allocator_settings import (
    AllocOption,
    accepted_everywhere,
    check_option,
    parse_alloc_conf,
    refused_before,
)
from nodecheck.checks.rules.job_versions import VersionEvidence
from nodecheck.tuning.bindings import RankBinding
from nodecheck.tuning.recommendation import DataLoaderHint, LeftUnset, Recommendation, plain

OLD_NAME = "PYTORCH_CUDA_ALLOC_CONF"
NEW_NAME = "PYTORCH_ALLOC_CONF"
# torch 2.9.0 is the first release that reads PYTORCH_ALLOC_CONF (the 2.8 change was
# reverted before release, pytorch PR #158031); PYTORCH_CUDA_ALLOC_CONF stays an alias.
NEW_NAME_SINCE = (2, 9)
ALLOCATOR_DOCS = "PyTorch docs, CUDA semantics: Optimizing memory usage with PYTORCH_ALLOC_CONF"
ML_ENGINEERING_PERFORMANCE = (
    'Stas Bekman, "Machine Learning Engineering" open book (github.com/stas00/ml-engineering), '
    "training performance chapter"
)


def parse_version(text: str) -> tuple[int, int] | None:
    """ "2.9.1+cu128" -> (2, 9)."""
    match = re.match(r"^(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def device_order() -> Recommendation:
    return Recommendation(
        "CUDA_DEVICE_ORDER",
        "PCI_BUS_ID",
        "CUDA numbers GPUs fastest first unless told otherwise, which can differ from bus "
        "order (nvidia-smi's, and sysfs's); local rank N is bound to the Nth GPU by bus id, "
        "so CUDA must count the same way",
        "CUDA Programming Guide, CUDA environment variables: CUDA_DEVICE_ORDER",
    )


def _join(options: list[AllocOption]) -> str:
    return ",".join(f"{option.name}:{option.value}" for option in options)


def allocator(environ: Mapping[str, str], torch: VersionEvidence) -> list[Recommendation]:
    """expandable_segments:True, merged into whatever valid options are set now, for the
    job's torch (`torch`; both names where it is not known)."""
    reads_new = torch.at_least(NEW_NAME_SINCE) is not False
    # Which value torch uses now: 2.9 and later read the new name first; older, only the old.
    current = environ.get(NEW_NAME, environ.get(OLD_NAME)) if reads_new else environ.get(OLD_NAME)
    if current is not None and not plain(current):
        current = current.strip() if current.strip().isprintable() else None
    reason = (
        "expandable segments let each stream's memory grow as one segment instead of caching "
        "fixed blocks: less fragmentation and fewer out-of-memory errors when shapes vary "
        "(not for jobs that pass CUDA tensors between processes over IPC)"
    )
    value = "expandable_segments:True"
    errors: list[str] = []
    if current is not None:
        options, errors = parse_alloc_conf(current, torch.known)
        valid = [o for o in options if check_option(o, torch.known) is None]
        older = refused_before(valid) if torch.known is None else []
        if older:
            # The job's torch is not known: an option only newer torch takes is raised to
            # what every torch takes, so the value works whichever torch runs it.
            valid = [accepted_everywhere(o) for o in valid]
            reason = f"{'; '.join(older)}, and {torch.describe()}; " + reason
        backend = next((o.value for o in valid if o.name == "backend"), "native")
        expandable = next((o.value for o in valid if o.name == "expandable_segments"), None)
        if errors:
            whose = "torch" if torch.known is None else torch.describe()
            reason = f"{whose} rejects the current value ({'; '.join(errors)}); " + reason
        if older:
            errors = older
        if not errors and backend == "cudaMallocAsync":
            value = current
            reason = (
                "cudaMallocAsync manages its own pool; expandable segments are for the "
                "native allocator"
            )
        elif not errors and expandable == "False":
            value = current
            reason = (
                "expandable segments are off on purpose, it seems: right if the job passes "
                "CUDA tensors over IPC, otherwise turn them on"
            )
        elif not errors and expandable == "True":
            value = current
        else:
            kept = [o for o in valid if o.name != "expandable_segments"]
            value = _join([*kept, AllocOption("expandable_segments", "True")])
    # A working setting of the user's is theirs to change (nodecheck exec leaves it).
    advisory = current is not None and not errors
    source = f"{ALLOCATOR_DOCS}; {ML_ENGINEERING_PERFORMANCE}: memory fragmentation"
    if not reads_new:
        reason += f" ({torch.describe()}: it reads only this name)"
    recommendations = [Recommendation(OLD_NAME, value, reason, source, advisory=advisory)]
    if reads_new:
        recommendations.append(
            Recommendation(
                NEW_NAME,
                value,
                f"torch 2.9 and later read this name first ({_which_torch(torch)}); the same "
                "value under both names holds for every version (2.9.1 ignored the new name "
                "for CUDA, pytorch issue #183387)",
                ALLOCATOR_DOCS,
                advisory=advisory,
                same_as=OLD_NAME,
            )
        )
    return recommendations


def _which_torch(torch: VersionEvidence) -> str:
    """ "torch 2.9.1 (from ...)", or why both names are set."""
    if torch.known is not None:
        return torch.describe()
    return f"{torch.describe()}, so both names are set"


# The book budgets one core for the training process plus one per DataLoader worker, and
# 2-4 workers for language models ("2 usually plenty"): ml-engineering
# training/performance/README.md, "DataLoader". torchrun's --numa-binding=exclusive
# (torch/numa/binding.py) gives each rank whole cores, SMT siblings included.
BUDGET_SOURCE = (
    f"{ML_ENGINEERING_PERFORMANCE}: DataLoader (one core for the process plus one per "
    "worker, 2 workers usually plenty for LMs); torch/numa/binding.py (torchrun "
    "--numa-binding=exclusive keeps each core's SMT siblings with it)"
)
DATALOADER_WORKERS = 2


@record
class CpuBudget:
    """How a rank's CPUs are shared among its threads: the training process's own thread
    (the Python loop, which is also the first of OpenMP's intra-op threads), the intra-op
    threads beyond it, the DataLoader's worker processes and its pin-memory thread (which
    exists only with workers: with none, the main thread pins). They add up to at most
    `cpus` whenever there are CPUs enough for one each."""

    cpus: int
    intra_op: int  # OMP_NUM_THREADS, the process's own thread included
    workers: int
    pin_thread: int
    cores: int = 0  # the physical cores among the CPUs (0: not known, each CPU a core)

    @property
    def used(self) -> int:
        return self.intra_op + self.workers + self.pin_thread

    def split(self) -> str:
        """ "OMP_NUM_THREADS=25 (the process's own thread and 24 more) + 2 DataLoader
        workers + 1 pin-memory thread = 28 of the rank's 28 CPUs"."""
        threads = f"OMP_NUM_THREADS={self.intra_op} (the training process's own thread"
        threads += f" and {self.intra_op - 1} more)" if self.intra_op > 1 else " alone)"
        parts = [threads]
        parts.append(
            f"{self.workers} DataLoader worker(s)"
            if self.workers
            else "no DataLoader worker (too few CPUs: batches load in the process)"
        )
        if self.pin_thread:
            parts.append("1 pin-memory thread")
        text = f"{' + '.join(parts)} = {self.used} of the rank's {self.cpus} CPU(s)"
        if self.cores and self.cores < self.cpus:
            text += (
                f" (intra-op threads at most one per physical core, {self.cores}: two on one "
                "core share its execution units; the SMT siblings take the workers and the "
                "pin-memory thread)"
            )
        if self.used > self.cpus:
            text += " (fewer CPUs than threads: they share)"
        return text


def rank_cpus(binding: RankBinding) -> int:
    """The CPUs (hardware threads) the rank is bound to: with SMT siblings unless left out."""
    return max(1, len(binding.cpus))


def rank_cores(inventory: Inventory, binding: RankBinding) -> int:
    """The physical cores among the rank's CPUs (a CPU whose topology is unknown counts as
    a core of its own)."""
    cpus = inventory.cpu.cpus
    cores = {cpus[n].siblings if n in cpus else frozenset({n}) for n in binding.cpus}
    return max(1, len(cores))


def cpu_budget(cpus: int, cores: int | None = None) -> CpuBudget:
    """Workers first up to the book's 2 (one CPU each, the pin thread one more), the
    process one, the intra-op threads the rest but at most one per physical core (torch's
    own default is the physical cores: PyTorch docs, CPU threading and TorchScript
    inference; its CPU performance tuning guide binds one OpenMP thread per physical
    core); with 3 CPUs or fewer, fewer workers. `cores` None: each CPU a core."""
    workers = min(DATALOADER_WORKERS, max(0, cpus - 2))
    pin_thread = 1 if workers else 0
    physical = cpus if cores is None else max(1, min(cores, cpus))
    intra_op = max(1, min(physical, cpus - workers - pin_thread))
    return CpuBudget(cpus, intra_op, workers, pin_thread, 0 if cores is None else physical)


def omp_threads(budget: CpuBudget, environ: Mapping[str, str]) -> Recommendation:
    current = environ.get("OMP_NUM_THREADS", "")
    threads = parse_count(current)
    source = (
        "torch/distributed/run.py (torchrun's default of 1); PyTorch docs, CPU threading; "
        + BUDGET_SOURCE
    )
    if threads is not None and 2 <= threads <= budget.intra_op:
        return Recommendation(
            "OMP_NUM_THREADS",
            str(threads),
            f"within the {budget.intra_op} the rank's budget leaves intra-op threads: your "
            "choice stands",
            source,
        )
    return Recommendation(
        "OMP_NUM_THREADS",
        str(budget.intra_op),
        f"the rank's CPU budget: {budget.split()}; torchrun sets 1 when it is unset, leaving "
        "CPU work in the training process on one CPU, and a count beyond the budget "
        "oversubscribes the CPUs the DataLoader's processes run on",
        source,
    )


def dataloader(budget: CpuBudget) -> DataLoaderHint:
    return DataLoaderHint(
        budget.workers,
        True,
        f"the rank's CPU budget: {budget.split()}; more workers rarely feed a GPU faster "
        "and take CPUs from the intra-op threads; pinned batches copy to the GPU "
        "asynchronously with .to(device, non_blocking=True), overlapping compute, and with "
        "--membind they sit on the GPU's NUMA node",
        f"{BUDGET_SOURCE}; PyTorch docs, torch.utils.data: memory pinning",
    )


# torchtitan's reference: torchtitan/distributed/utils.py init_distributed sets
# TORCH_FR_BUFFER_SIZE to comm.trace_buf_size (20000 by default, torchtitan/config/
# job_config.py) and TORCH_NCCL_DUMP_ON_TIMEOUT=1 whenever the buffer is on.
FLIGHT_RECORDER_ENTRIES = 20000
# torch 2.9 renamed TORCH_NCCL_TRACE_BUFFER_SIZE to TORCH_FR_BUFFER_SIZE and
# TORCH_NCCL_DEBUG_INFO_TEMP_FILE to TORCH_FR_DUMP_TEMP_FILE; the old names still work
# there, with a deprecation warning (torch/csrc/distributed/c10d/Utils.hpp getCvarInt:
# "Environment variable ... is deprecated; use ... instead"; ml-engineering
# debug/pytorch.md), and are the only ones releases before 2.8 read (the flight recorder
# was NCCL's own then: torch/csrc/distributed/c10d/NCCLUtils.hpp). 2.8's vendor-neutral
# recorder (torch/csrc/distributed/c10d/FlightRecorder.hpp) already reads both names of
# the size and of the file, the new first, as the 2.8.0 wheel's libtorch_cpu shows; the
# old names are what works on every release before 2.9, so those are what is set there.
FR_NAME_SINCE = (2, 9)
FLIGHT_RECORDER_SOURCE = (
    "PyTorch docs, torch.distributed NCCL environment variables (TORCH_NCCL_DUMP_ON_TIMEOUT "
    "needs a trace buffer larger than 0); PyTorch tutorial, Flight Recorder; torchtitan "
    "torchtitan/distributed/utils.py (init_distributed) and torchtitan/config/job_config.py "
    "(comm.trace_buf_size = 20000); ml-engineering debug/pytorch.md"
)


OLD_BUFFER_NAME = "TORCH_NCCL_TRACE_BUFFER_SIZE"
NEW_BUFFER_NAME = "TORCH_FR_BUFFER_SIZE"
OLD_DUMP_FILE_NAME = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
NEW_DUMP_FILE_NAME = "TORCH_FR_DUMP_TEMP_FILE"


def buffer_names(torch: VersionEvidence) -> list[str]:
    """The flight recorder's size variable(s) for the job's torch: the old name before
    2.9, the new one after, both where the version is not known."""
    newer = torch.at_least(FR_NAME_SINCE)
    if newer is None:
        return [NEW_BUFFER_NAME, OLD_BUFFER_NAME]
    return [NEW_BUFFER_NAME] if newer else [OLD_BUFFER_NAME]


def dump_file_name(torch: VersionEvidence) -> str:
    """How the text names the dump file's variable for the job's torch."""
    newer = torch.at_least(FR_NAME_SINCE)
    if newer is None:
        return f"{NEW_DUMP_FILE_NAME} ({OLD_DUMP_FILE_NAME} before torch 2.9)"
    return NEW_DUMP_FILE_NAME if newer else OLD_DUMP_FILE_NAME


def post_mortem(environ: Mapping[str, str], torch: VersionEvidence) -> list[Recommendation]:
    """The flight recorder and its dump on a collective's timeout: without them a hung
    job ends with only the watchdog's "timed out" line, and no record of which rank
    stopped at which collective. For the job's torch (`torch`): where it is not known,
    the size goes under both names, which every torch takes (a torch before 2.9 reads only
    the old one, default 0: the recorder off and the dump nothing to write)."""
    # The size in force now: the first of the names set, new one first as torch reads them
    # (whichever names the job's torch reads: a size set under the other name is the
    # user's too, and is recommended under that name as well, so `exec` keeps it).
    set_names = [n for n in (NEW_BUFFER_NAME, OLD_BUFFER_NAME) if environ.get(n) is not None]
    names = [n for n in (NEW_BUFFER_NAME, OLD_BUFFER_NAME) if n in buffer_names(torch) + set_names]
    counts = {name: parse_count(environ[name]) for name in set_names}
    # The first name holding a count: one holding anything else is no size of the user's.
    entries = next((count for count in counts.values() if count is not None), None)
    keeps = entries is not None and entries > 0
    which = (
        f" ({torch.describe()}: this name)"
        if torch.known is not None
        else f"; {torch.describe()}: both names, the old one for torch before 2.9"
    )
    reason = (
        (
            "your flight recorder size stands"
            if keeps
            else f"the flight recorder keeps the last {FLIGHT_RECORDER_ENTRIES} collectives "
            "of each rank (torchtitan's default) in a ring buffer, so a timeout shows which "
            "rank stopped where (the book's lighter choice is 2000)"
        )
        + "; the cost: host memory for that many entries per rank (metadata, and a stack "
        "trace each) and a record per collective on the calling thread, small next to the "
        "collective itself" + which
    )
    value = str(entries) if keeps else str(FLIGHT_RECORDER_ENTRIES)
    buffers = [
        Recommendation(
            name,
            value,
            reason,
            FLIGHT_RECORDER_SOURCE,
            # A size of 0 set on purpose stays the user's; a value that is no count does not.
            advisory=counts.get(name) is not None,
            # Each name keeps the user's value where the other does (rank_exec).
            same_as=next((other for other in names if other != name), None),
        )
        for name in names
    ]
    dump_now = environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT")
    dump = Recommendation(
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "1",
        "on a collective's timeout each rank writes its flight recorder to the file "
        f"{dump_file_name(torch)} names"
        + (f" (for {torch.describe()})" if torch.known is not None else "")
        + ", with the rank appended (its default place depends on the torch release; "
        "point it at shared storage, as torchtitan does with <dump folder>/comm_traces/rank_) "
        "before the process ends; torch's analyzer (torch.distributed.flight_recorder) then "
        "names the rank that diverged; the cost: one file per rank, written only on a timeout",
        FLIGHT_RECORDER_SOURCE,
        advisory=dump_now is not None and dump_now.strip() != "1",
    )
    return [*buffers, dump]


@record
class CodeHint:
    """A change to make in the training script, which no variable can make."""

    title: str
    code: str
    reason: str
    source: str


def code_hints() -> list[CodeHint]:
    return [
        CodeHint(
            "garbage collection at the same step on every rank",
            "gc.disable() before the loop; gc.collect(1) when step % 50 == 0",
            "Python's collector runs when each process's allocation count says so, at a "
            "different moment on each rank: the rank collecting stalls, and every other "
            "waits for it at the next collective (a straggler); turned off and run every N "
            "steps, it pauses all ranks at once (torchtitan's training.gc_freq is 50 steps)",
            f"{ML_ENGINEERING_PERFORMANCE}; torchtnt "
            "torchtnt/framework/callbacks/garbage_collector.py (periodic synchronous garbage "
            "collection for fully synchronous distributed training); torchtitan "
            "torchtitan/config/job_config.py (training.gc_freq)",
        ),
        CodeHint(
            "torchrun's own binding, the built-in alternative to nodecheck exec",
            "torchrun --numa-binding=exclusive --nproc_per_node=N train.py",
            "torch 2.9 and later bind each worker by its GPU's NUMA node (node, socket, "
            "exclusive or core-complex): better where only the binding is wanted and "
            "nodecheck is not in the image; nodecheck exec is better where the rank's own "
            "variables (OMP_NUM_THREADS from its budget, NCCL's), the cpuset, --membind, "
            "srun without torchrun, or a refusal of a GPU CUDA cannot drive matter",
            "PyTorch docs, NUMA Binding (docs.pytorch.org/docs/main/elastic/numa.html); "
            "torch/numa/binding.py",
        ),
    ]


# TORCH_NCCL_ASYNC_ERROR_HANDLING's modes (pytorch/pytorch torch/csrc/distributed/c10d/
# ProcessGroupNCCL.hpp, ErrorHandlingMode; PyTorch docs, torch.distributed NCCL environment
# variables): 0 no handling, 1 abort the communicators then end the process, 2 abort them
# and keep the process, 3 end the process without aborting them (the default), added
# because ncclCommAbort can itself hang (pytorch PR #102599). The watchdog of torch 2.3
# and older aborted the communicators (1, 2) before it launched the flight recorder's
# dump, and with 1 the process ended before the dump was written (pytorch issue #121055,
# "Flight Recorder dumps fail when TORCH_NCCL_ASYNC_ERROR_HANDLING=1"); pytorch PR #123023
# (April 2024, torch 2.4) put the dump first: the watchdog signals it and waits for it
# (TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC) before any abort, whatever the mode.
DUMP_BEFORE_ABORT_SINCE = (2, 4)
ASYNC_ERROR_SOURCE = (
    "PyTorch docs, torch.distributed NCCL environment variables; pytorch/pytorch "
    "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (watchdog), pytorch/pytorch#121055, "
    "#102599, #123023"
)


def async_error_handling_verdict(value: str, torch: VersionEvidence) -> str:
    """What a TORCH_NCCL_ASYNC_ERROR_HANDLING someone set means (0 the checks flag), by
    the job's torch (both outcomes said where it is not known)."""
    mode = value.strip()
    if mode == "3":
        return "torch's default"
    if mode == "2":
        return (
            "2 aborts the communicators and keeps the process: the failure reaches the "
            "training code as an error, which must handle it or the job stops making progress"
        )
    if mode != "1":
        return "none of torch's modes (0-3)"
    installed = f" ({torch.describe()})"
    if torch.at_least(DUMP_BEFORE_ABORT_SINCE) is False:
        return (
            f"warning: with torch 2.3 and older{installed} the watchdog aborts the NCCL "
            "communicators before it launches the flight recorder's dump, and with 1 the "
            "process ends before the dump is written (pytorch issue #121055): unset it (3, "
            "the default, ends the process without that abort)"
        )
    return (
        "kept, at a cost: torch 2.4 and later" + installed + " wait for the flight "
        "recorder's dump (up to TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC) before any abort, so it "
        "is written (with torch 2.3 and older, 1 ended the process first: pytorch issue "
        "#121055); 1 then calls ncclCommAbort before "
        "ending the process, which can hang where a GPU or NIC is wedged, the reason the "
        "default 3 skips it"
    )


def left_to_torch() -> list[LeftUnset]:
    return [
        LeftUnset(
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING",),
            "torch's default (3) ends the process when a collective fails or times out, "
            "so the job restarts instead of hanging",
            ASYNC_ERROR_SOURCE,
        ),
        LeftUnset(
            ("CUDA_DEVICE_MAX_CONNECTIONS",),
            "depends on the framework: Megatron-LM asserts 1 for tensor or context "
            "parallelism before Blackwell, while FSDP wants it unset",
            "Megatron-LM megatron/training/arguments.py",
        ),
    ]
