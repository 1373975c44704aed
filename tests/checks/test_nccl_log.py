"""NCCL's tuning log read for the algorithm of each all_reduce payload: literal lines of
every form NVIDIA/nccl src/enqueue.cc writes (2.20 to master), garbage, truncated and
missing files."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodecheck.checks.bench import nccl_log
from nodecheck.checks.bench.nccl_log import algorithm_label, algorithms_in, read_segment

# The lines below are NVIDIA/nccl's own format strings filled in, each with the tag it was
# read at, behind the prefix of src/debug.cc ("%s:%d:%d [%d] NCCL INFO ": host, pid, tid,
# cudaDev). Before 2.20 (v2.19.3-1 src/enqueue.cc) the INFO line is commented out.
#
# v2.21.5-1 src/enqueue.cc (2.20-2.22): on rank 0,
#   INFO(NCCL_TUNING, "%ld Bytes -> Algo %d proto %d time %f", ...)
NUMBERED = """\
dgx01:48211:48211 [0] NCCL INFO Bootstrap : Using ibp24s0:10.0.0.1<0>
dgx01:48211:48211 [0] NCCL INFO 4 Bytes -> Algo 1 proto 0 time 8.610000
dgx01:48211:48211 [0] NCCL INFO 67108864 Bytes -> Algo 4 proto 2 time 201.548004
dgx01:48211:48211 [0] NCCL INFO 4 Bytes -> Algo 0 proto 0 time 6.400000
"""
# v2.23.4-1 src/enqueue.cc: the collective first (ncclFuncToString, src/collectives.cc),
#   INFO(NCCL_TUNING, "%s: %ld Bytes -> Algo %d proto %d time %f", ...)
NUMBERED_WITH_FUNCTION = """\
dgx01:50110:50110 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo 1 proto 2 time 12.750000
dgx01:50110:50110 [0] NCCL INFO Broadcast: 1048576 Bytes -> Algo 1 proto 0 time 9.100000
dgx01:50110:50110 [0] NCCL INFO AllReduce: 4 Bytes -> Algo 0 proto 0 time 6.400000
"""
# v2.24.3-1 to master (5067397c) src/enqueue.cc: names (ncclAlgoToString, ncclProtoToString),
#   INFO(NCCL_TUNING, "%s: %ld Bytes -> Algo %s proto %s channel{Lo..Hi}={%d..%d}", ...)
NAMED = """\
n1:5:5 [0] NCCL INFO AllReduce: 67108864 Bytes -> Algo NVLS_TREE proto SIMPLE channel{Lo..Hi}={0..7}
n1:5:5 [0] NCCL INFO AllGather: 67108864 Bytes -> Algo PAT proto SIMPLE channel{Lo..Hi}={0..15}
n1:5:5 [0] NCCL INFO AllReduce: 4 Bytes -> Algo TREE proto LL channel{Lo..Hi}={0..0}
n1:5:5 [0] NCCL INFO AllReduce: 67108864 Bytes -> Algo RING proto LL128 channel{Lo..Hi}={0..7}
"""


def test_the_numbered_form_at_the_payload_size() -> None:
    # 67108864 bytes ran NVLS (4); the 4-byte barriers' Ring and Tree are not the payload's.
    assert algorithms_in(NUMBERED, 64 << 20) == ["nvls"]
    assert algorithm_label(NUMBERED, 4) == "ring+tree"
    assert algorithm_label(NUMBERED, 1 << 30) == "unknown"  # no line of that size


def test_the_function_prefix_keeps_only_all_reduce() -> None:
    """2.23: the Broadcast of the same size is not the payload's all_reduce."""
    assert algorithm_label(NUMBERED_WITH_FUNCTION, 1 << 20) == "ring"
    assert algorithm_label(NUMBERED_WITH_FUNCTION, 4) == "tree"


def test_the_named_form_by_size_and_function() -> None:
    assert algorithm_label(NAMED, 64 << 20) == "nvls_tree+ring"  # the AllGather's PAT left out
    assert algorithm_label(NAMED, 4) == "tree"
    for name, label in [
        ("TREE", "tree"),
        ("RING", "ring"),
        ("COLLNET_DIRECT", "collnet_direct"),
        ("COLLNET_CHAIN", "collnet_chain"),
        ("NVLS", "nvls"),
        ("NVLS_TREE", "nvls_tree"),
        ("PAT", "pat"),
    ]:
        line = (
            f"h:1:2 [3] NCCL INFO AllReduce: 1024 Bytes -> Algo {name} proto SIMPLE "
            "channel{Lo..Hi}={0..1}\n"
        )
        assert algorithm_label(line, 1024) == label
        assert algorithm_label(line, 2048) == "unknown"


def test_every_algorithm_number_of_nccl_common_h() -> None:
    labels = [
        algorithm_label(f"h:1:1 [0] NCCL INFO 1024 Bytes -> Algo {n} proto 2 time 1.5\n", 1024)
        for n in range(7)
    ]
    assert labels == ["tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"]


def test_repeats_count_once_and_timestamps_do_not_matter() -> None:
    # NCCL_DEBUG_TIMESTAMP_FORMAT puts the time before the host (src/debug.cc).
    line = (
        "[2026-12-01 10:00:00] h:1:2 [0] NCCL INFO AllReduce: 1024 Bytes -> Algo RING "
        "proto LL channel{Lo..Hi}={0..3}\n"
    )
    assert algorithm_label(line * 3, 1024) == "ring"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage\n\x00\x01binary",
        "h:1:1 [0] NCCL INFO 1024 Bytes -> Algo 99 proto 2 time 1.5\n",  # no such number
        "h:1:1 [0] NCCL INFO AllReduce: 1024 Bytes -> Algo Unknown proto SIMPLE ch\n",
        "h:1:1 [0] NCCL INFO AllReduce: 1024 Bytes -> Algo HYPERCUBE proto SIMPLE ch\n",
        "h:1:1 [0] NCCL INFO ReduceScatter: 1024 Bytes -> Algo RING proto SIMPLE ch\n",
        "h:1:1 [0] NCCL WARN AllReduce: 1024 Bytes -> Algo RING proto SIMPLE ch\n",  # not INFO
        "h:1:1 [0] NCCL INFO AllReduce: 1024 Bytes -> Algo RI",  # cut mid-line
        "AllReduce: 1024 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}\n",  # no prefix
        # A form no NCCL tag writes (reviewed against NVIDIA/nccl's tags): not read.
        "h:1:1 [0] NCCL INFO Best tuning, algorithm, Ring, protocol, Simple\n",
    ],
)
def test_anything_else_is_unknown(text: str) -> None:
    assert algorithm_label(text, 1024) == "unknown"


def test_a_segment_of_the_file(tmp_path: Path) -> None:
    log = tmp_path / "nccl.dgx01.4242"
    log.write_text(NUMBERED)
    start = nccl_log.log_size(log)
    with log.open("a") as more:
        more.write(NAMED)
    assert algorithm_label(read_segment(log, start), 64 << 20) == "nvls_tree+ring"
    # From the start, the numbered line of that size too.
    assert algorithm_label(read_segment(log, 0), 64 << 20) == "nvls+nvls_tree+ring"


def test_a_missing_or_truncated_file_is_unknown(tmp_path: Path) -> None:
    missing = tmp_path / "nccl.dgx01.1"
    assert nccl_log.log_size(missing) is None
    assert algorithm_label(read_segment(missing, 0)) == "unknown"
    assert read_segment(None, 0) == ""
    log = tmp_path / "nccl.dgx01.2"
    log.write_text(NAMED)
    start = nccl_log.log_size(log)
    log.write_text("")  # truncated after the offset was taken
    assert algorithm_label(read_segment(log, start), 64 << 20) == "unknown"


def test_what_is_read_is_bounded(tmp_path: Path) -> None:
    """A tuning line past the bound is not read; a line cut by the bound is left out."""
    log = tmp_path / "nccl.dgx01.3"
    filler = "h:1:1 [0] NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7\n" * 4000
    log.write_text(filler + NAMED)
    assert len(filler) > nccl_log.MAX_SEGMENT_BYTES
    assert algorithm_label(read_segment(log, 0), 64 << 20) == "unknown"
    cut = read_segment(log, len(filler), limit=len(NAMED) - 5)
    assert cut == "".join(NAMED.splitlines(keepends=True)[:3])


def test_the_rank_log_is_found_by_pid(tmp_path: Path) -> None:
    """NCCL_DEBUG_FILE=<dir>/nccl.%h.%p: %h is the host name cut at its first dot."""
    assert nccl_log.rank_log_file(tmp_path, 4242) is None
    assert nccl_log.rank_log_file(tmp_path / "absent", 4242) is None
    (tmp_path / "nccl.dgx01.42420").write_text("")
    (tmp_path / "nccl.dgx01.4242").write_text("")
    assert nccl_log.rank_log_file(tmp_path, 4242) == tmp_path / "nccl.dgx01.4242"


def test_warnings_are_found_for_stderr(tmp_path: Path) -> None:
    """With NCCL_DEBUG_FILE, NCCL's warnings (why a rank failed) go to the file too."""
    text = (
        "dgx01:1:1 [0] NCCL INFO AllReduce: 4 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}\n"
        "dgx01:1:1 [0] NCCL WARN Cuda failure 'out of memory'\n"
        f"dgx01:1:1 [0] NCCL WARN {'x' * 1000}\n" + "dgx01:1:1 [0] NCCL WARN again\n" * 50
    )
    found = nccl_log.warnings_in(text)
    assert found[0] == "dgx01:1:1 [0] NCCL WARN Cuda failure 'out of memory'"
    assert len(found) == nccl_log.MAX_WARNINGS
    assert max(map(len, found)) == nccl_log.MAX_WARNING_CHARS
    assert nccl_log.warnings_in(NAMED + NUMBERED_WITH_FUNCTION + NUMBERED) == []
    (tmp_path / "nccl.a.1").write_text("")
    (tmp_path / "other").write_text("")
    assert nccl_log.log_files(tmp_path) == [tmp_path / "nccl.a.1"]
    assert nccl_log.log_files(tmp_path / "absent") == []


def test_warnings_of_the_head_and_the_tail_of_a_long_log(tmp_path: Path) -> None:
    """Init's warnings are at the head of the file, a failure's at its tail: both relayed,
    the middle of a long log left out, the tail's first (cut) line too."""
    # src/debug.cc (master): "[%d] %s:%d (%s) NCCL WARN %s" with the source file and line.
    init = "dgx01:7:7 [0] transport/net_ib.cc:503 (ncclIbInit) NCCL WARN NET/IB : No device found\n"
    middle = "dgx01:7:7 [0] NCCL WARN in the middle\n"
    filler = "dgx01:7:7 [0] NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7\n" * 3000
    end = "dgx01:7:7 [0] enqueue.cc:1 NCCL WARN Cuda failure 'an illegal memory access'\n"
    log = tmp_path / "nccl.dgx01.7"
    log.write_text(init + filler + middle + filler + end)
    assert len(filler) > nccl_log.MAX_SEGMENT_BYTES
    assert nccl_log.warnings_in_file(log) == [init.rstrip("\n"), end.rstrip("\n")]
    short = tmp_path / "nccl.dgx01.8"
    short.write_text(init + middle + end)
    assert len(nccl_log.warnings_in_file(short)) == 3
    assert nccl_log.warnings_in_file(tmp_path / "nccl.dgx01.9") == []
