"""Judging PyTorch caching-allocator settings (`PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_ALLOC_CONF`).

The allocator parses its configuration at the first CUDA allocation and
raises on any unknown option or bad value ("Unrecognized CachingAllocator
option"), so a typo kills every rank of a job after it has been scheduled.
`parse_alloc_conf` follows c10/core/AllocatorConfig.cpp (lexArgs and the
parse* functions): separators `, : [ ]`, spaces dropped, names and True/False
case-sensitive. Pure functions of Settings: the torch_alloc check and `tune` (the
allocator it recommends, the settings it removes) both judge with these.
"""

from __future__ import annotations

import re

from nodecheck.checks.node.variables import CALLING_ENVIRONMENT, Setting
from nodecheck.checks.record import record
from nodecheck.checks.result import NODE, Result, Status
from nodecheck.checks.rules.job_versions import VersionEvidence
from nodecheck.checks.settings_audit import SettingJudgement

ALLOC_CONF_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
RECOMMENDED = "expandable_segments:True"

BOOLEAN_OPTIONS = {
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_use_background_threads",
    "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom",
}
# The floor of these two is kLargeBuffer, 20 MiB, but not the same test in every torch:
# before 2.10 the CUDA allocator parsed them itself and wanted more than 20
# (c10/cuda/CUDAAllocatorConfig.cpp, parseMaxSplitSize and parseMaxNonSplitRoundingSize:
# `val1 > kLargeBuffer / mb`, "must be > 20"); from 2.10 it hands them to the
# device-generic parser, which takes 20 (c10/core/AllocatorConfig.cpp,
# AcceleratorAllocatorConfig::parseMaxSplitSize: `val_env >= min_allowed_split_size_mb`,
# "must be >= 20"). The release wheels agree: 2.9.0's libc10_cuda.so still holds the
# "must be > " parser, 2.10.0's none of its own.
MIN_MB_OPTIONS = {"max_split_size_mb": 20, "max_non_split_rounding_mb": 20}
MIN_MB_INCLUSIVE_SINCE = (2, 10)
OTHER_OPTIONS = {
    "backend",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "pinned_num_register_threads",
    "per_process_memory_fraction",
    "pinned_reserve_segment_size_mb",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
    "large_segment_size_mb",
}
KNOWN_OPTIONS = BOOLEAN_OPTIONS | set(MIN_MB_OPTIONS) | OTHER_OPTIONS
NATIVE_ONLY = {"max_split_size_mb", "garbage_collection_threshold", "roundup_power2_divisions"}
MAX_REGISTER_THREADS = 128  # c10 pinned_max_register_threads()


def lex_alloc_conf(text: str) -> list[str]:
    """Tokens as c10's AllocatorConfig::lexArgs makes them."""
    tokens: list[str] = []
    buffer = ""
    for char in text:
        if char in ",:[]":
            if buffer:
                tokens.append(buffer)
                buffer = ""
            tokens.append(char)
        elif char != " ":
            buffer += char
    if buffer:
        tokens.append(buffer)
    return tokens


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@record
class AllocOption:
    name: str
    value: str


def parse_alloc_conf(
    text: str, torch: tuple[int, ...] | None = None
) -> tuple[list[AllocOption], list[str]]:
    """Options and the errors torch would raise for them (an empty list: torch accepts it):
    the job's torch `torch` (major, minor, ...), or None where it is not known, when only
    what every torch refuses counts (`refused_before` says what only older ones do)."""
    tokens = lex_alloc_conf(text)
    options: list[AllocOption] = []
    errors: list[str] = []
    index = 0
    while index < len(tokens):
        name = tokens[index]
        if name in ",:[]":
            errors.append(f"unexpected {name!r}")
            index += 1
            continue
        if index + 1 >= len(tokens) or tokens[index + 1] != ":":
            errors.append(f"{name}: expected ':' and a value")
            break
        index += 2
        if index < len(tokens) and tokens[index] == "[":
            end = tokens.index("]", index) if "]" in tokens[index:] else len(tokens) - 1
            value = "".join(tokens[index : end + 1])
            index = end + 1
        elif index < len(tokens):
            value = tokens[index]
            index += 1
        else:
            value = ""
        options.append(AllocOption(name, value))
        if index < len(tokens):
            if tokens[index] != ",":
                errors.append(f"expected ',' after {name}:{value}")
                break
            index += 1
    for option in options:
        problem = check_option(option, torch)
        if problem:
            errors.append(problem)
    return options, errors


def _inclusive_floor(torch: tuple[int, ...] | None) -> bool:
    """Whether the MiB options' floor itself is taken (torch 2.10 and later, or unknown)."""
    return torch is None or torch[:2] >= MIN_MB_INCLUSIVE_SINCE


def refused_before(options: list[AllocOption]) -> list[str]:
    """What torch before 2.10 refuses among options newer torch takes (a MiB option at
    its floor, 20): to say where the job's torch is not known."""
    return [
        f"{o.name}:{o.value}: torch before 2.10 refuses it (it needs more than "
        f"{MIN_MB_OPTIONS[o.name]}; {MIN_MB_OPTIONS[o.name] + 1} works on every torch)"
        for o in options
        if o.name in MIN_MB_OPTIONS and o.value.isdigit() and int(o.value) == MIN_MB_OPTIONS[o.name]
    ]


def accepted_everywhere(option: AllocOption) -> AllocOption:
    """The option as every torch takes it: a MiB option at its floor one above it."""
    if option.name in MIN_MB_OPTIONS and option.value == str(MIN_MB_OPTIONS[option.name]):
        return AllocOption(option.name, str(MIN_MB_OPTIONS[option.name] + 1))
    return option


def check_option(option: AllocOption, torch: tuple[int, ...] | None = None) -> str | None:
    """Why torch refuses the option (None: it takes it). `torch` the job's (major, minor),
    None where not known: then only what every torch refuses."""
    name, value = option.name, option.value
    if name not in KNOWN_OPTIONS:
        return f"unknown option {name!r} (torch aborts: Unrecognized CachingAllocator option)"
    if name in BOOLEAN_OPTIONS:
        if value not in ("True", "False"):
            return f"{name} takes True or False, exactly so spelled, not {value!r}"
        return None
    if name in MIN_MB_OPTIONS:
        if not value.isdigit():
            return f"{name} takes a number of MiB, not {value!r}"
        floor = MIN_MB_OPTIONS[name]
        if int(value) < floor:
            return f"{name}:{value} is too small: torch requires at least {floor}"
        if int(value) == floor and not _inclusive_floor(torch):
            release = ".".join(map(str, torch or ()))
            return (
                f"{name}:{value} is too small for torch {release}: before 2.10 it needs more "
                f"than {floor} ({floor + 1} or more)"
            )
        return None
    if name == "backend":
        if value not in ("native", "cudaMallocAsync"):
            return f"backend is native or cudaMallocAsync, not {value!r}"
        return None
    if name == "garbage_collection_threshold":
        try:
            threshold = float(value)
        except ValueError:
            return f"garbage_collection_threshold takes a fraction, not {value!r}"
        if not 0 < threshold < 1:
            return f"garbage_collection_threshold must lie strictly between 0 and 1, not {value}"
        return None
    if name == "roundup_power2_divisions":
        return _check_roundup(value)
    if name == "pinned_num_register_threads":
        if not value.isdigit() or not _power_of_two(int(value)):
            return f"pinned_num_register_threads must be a power of two, not {value!r}"
        if int(value) > MAX_REGISTER_THREADS:
            return f"pinned_num_register_threads must be at most {MAX_REGISTER_THREADS}"
    return None


def _check_roundup(value: str) -> str | None:
    if not value.startswith("["):
        if not value.isdigit() or not _power_of_two(int(value)):
            return f"roundup_power2_divisions must be a power of two, not {value!r}"
        return None
    for item in filter(None, value.strip("[]").split(",")):
        interval, _, divisions = item.partition(":")
        if not divisions.isdigit() or (int(divisions) and not _power_of_two(int(divisions))):
            return f"roundup_power2_divisions: {item!r} needs a power of two (or 0) of divisions"
        if interval != ">" and (not interval.isdigit() or not _power_of_two(int(interval))):
            return f"roundup_power2_divisions: interval {interval!r} must be a power of two MiB"
    return None


def judge_alloc_setting(
    setting: Setting, torch: VersionEvidence | None = None
) -> list[SettingJudgement]:
    """`torch`: the version of the job that reads the setting, and where it was read
    (None, or one not known: what only older torch refuses is a warning)."""
    name = setting.name.strip()
    if name == "PYTORCH_NO_CUDA_MEMORY_CACHING" and setting.value.strip() not in ("", "0"):
        return [
            SettingJudgement(
                Status.WARN,
                "turns off the caching allocator: every tensor is a cudaMalloc "
                "(a debugging setting)",
            )
        ]
    if name not in ALLOC_CONF_NAMES:
        return []
    known = None if torch is None else torch.known
    options, errors = parse_alloc_conf(setting.value, known)
    if errors:
        whose = "torch" if known is None or torch is None else torch.describe()
        return [
            SettingJudgement(
                Status.FAIL,
                f"{whose} will abort at the first CUDA allocation: " + "; ".join(errors),
            )
        ]
    older = refused_before(options) if known is None else []
    if older:
        unknown = "the job's torch is not known" if torch is None else torch.describe()
        return [SettingJudgement(Status.WARN, f"{'; '.join(older)}; {unknown}")]
    names = {option.name for option in options}
    backend = next((o.value for o in options if o.name == "backend"), "native")
    if backend == "cudaMallocAsync" and names & NATIVE_ONLY:
        ignored = ", ".join(sorted(names & NATIVE_ONLY))
        return [SettingJudgement(Status.WARN, f"backend:cudaMallocAsync ignores {ignored}")]
    return []


def both_names_disagree(settings: list[Setting]) -> list[Result]:
    """The two names set differently in one source: which wins depends on the torch version."""
    by_source: dict[str, dict[str, str]] = {}
    for setting in settings:
        if setting.name in ALLOC_CONF_NAMES:
            by_source.setdefault(setting.source.label, {})[setting.name] = setting.value
    results = []
    for label, values in by_source.items():
        if len(values) == 2 and len(set(values.values())) == 2:
            results.append(
                Result(
                    Status.WARN,
                    NODE,
                    f"{label} sets PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF differently: "
                    "torch < 2.9 reads only the first, newer torch prefers the second",
                    "set both to the same value, or only PYTORCH_CUDA_ALLOC_CONF",
                    {"values": values},
                )
            )
    return results


def expandable_segments_advice(settings: list[Setting]) -> tuple[str, str]:
    """What the calling environment's allocator setting says of expandable segments, and
    the remedy: (text, remedy), the remedy empty when they are on."""
    own = [s for s in settings if s.source == CALLING_ENVIRONMENT and s.name in ALLOC_CONF_NAMES]
    if any(re.search(r"expandable_segments\s*:\s*True", setting.value) for setting in own):
        return "expandable segments are on in the calling environment", ""
    if own:
        return (
            "the calling environment sets the allocator without expandable segments",
            "add expandable_segments:True unless the job shares tensors over CUDA IPC",
        )
    return (
        "no allocator configuration in the calling environment",
        f"export PYTORCH_CUDA_ALLOC_CONF={RECOMMENDED} (less fragmentation with "
        "varying shapes; not for jobs that share tensors over CUDA IPC)",
    )
