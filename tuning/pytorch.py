"""PyTorch and CUDA settings: GPU numbering, the caching allocator, CPU threads and the
DataLoader, per hardware.md §4 and the training performance chapter of Stas Bekman's
"Machine Learning Engineering" open book (github.com/stas00/ml-engineering,
training/performance/README.md: "Memory fragmentation", "DataLoader").

The installed torch's version decides the allocator variable's name; it is read
from the package metadata, never by importing torch (which takes seconds).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import metadata

from nodecheck.checks.host.torch_alloc import AllocOption, check_option, parse_alloc_conf
from nodecheck.checks.node.inventory import Inventory
from nodecheck.checks.node.variables import parse_count
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


def installed_torch_version() -> tuple[int, int] | None:
    """(major, minor) of the torch installed for this Python, or None when there is none."""
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    return parse_version(version)


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


def allocator(
    environ: Mapping[str, str], torch_version: tuple[int, int] | None
) -> list[Recommendation]:
    """expandable_segments:True, merged into whatever valid options are set now."""
    reads_new = torch_version is None or torch_version >= NEW_NAME_SINCE
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
        options, errors = parse_alloc_conf(current)
        valid = [o for o in options if check_option(o) is None]
        backend = next((o.value for o in valid if o.name == "backend"), "native")
        expandable = next((o.value for o in valid if o.name == "expandable_segments"), None)
        if errors:
            reason = f"torch rejects the current value ({'; '.join(errors)}); " + reason
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
    recommendations = [Recommendation(OLD_NAME, value, reason, source, advisory=advisory)]
    if reads_new:
        installed = (
            f"torch {torch_version[0]}.{torch_version[1]} here"
            if torch_version
            else "no torch in this Python, so its version is unknown"
        )
        recommendations.append(
            Recommendation(
                NEW_NAME,
                value,
                f"torch 2.9 and later read this name first ({installed}); the same value under "
                "both names holds for every version (2.9.1 ignored the new name for CUDA, "
                "pytorch issue #183387)",
                ALLOCATOR_DOCS,
                advisory=advisory,
                same_as=OLD_NAME,
            )
        )
    return recommendations


def physical_cores(inventory: Inventory, binding: RankBinding) -> int:
    cores = {inventory.cpu.cpus[c].siblings for c in binding.cpus if c in inventory.cpu.cpus}
    return len(cores) or len(binding.cpus)


def omp_threads(cores: int, environ: Mapping[str, str]) -> Recommendation:
    current = environ.get("OMP_NUM_THREADS", "")
    threads = parse_count(current)
    source = "torch/distributed/run.py (torchrun's default of 1); PyTorch docs, CPU threading"
    if threads is not None and 2 <= threads <= cores:
        return Recommendation(
            "OMP_NUM_THREADS",
            str(threads),
            f"within the rank's {cores} physical cores: your choice stands",
            source,
        )
    return Recommendation(
        "OMP_NUM_THREADS",
        str(cores),
        f"one intra-op thread per physical core of the rank's {cores}: torchrun sets 1 when "
        "it is unset, leaving CPU work in the training process on one core; more than the "
        "rank's cores oversubscribes them (DataLoader workers run one thread each)",
        source,
    )


def dataloader(cores: int) -> DataLoaderHint:
    workers = max(1, cores - 2)
    return DataLoaderHint(
        workers,
        True,
        f"the rank's {cores} cores less one for the training loop and one for the "
        "pin-memory thread; pinned batches copy to the GPU asynchronously with "
        ".to(device, non_blocking=True), overlapping compute, and with --membind they "
        "sit on the GPU's NUMA node",
        f"{ML_ENGINEERING_PERFORMANCE}: DataLoader (asynchronous DataLoader, pinned memory "
        "and non-blocking device copy); PyTorch docs, torch.utils.data: memory pinning",
    )


def left_to_torch() -> list[LeftUnset]:
    return [
        LeftUnset(
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING",),
            "torch's default (3) ends the process when a collective fails, so the job "
            "restarts instead of hanging until its timeout",
            "PyTorch docs, torch.distributed NCCL environment variables",
        ),
        LeftUnset(
            ("CUDA_DEVICE_MAX_CONNECTIONS",),
            "depends on the framework: Megatron-LM asserts 1 for tensor or context "
            "parallelism before Blackwell, while FSDP wants it unset",
            "Megatron-LM megatron/training/arguments.py",
        ),
    ]
