"""NCCL's tuning log read for the algorithm of each all_reduce payload: literal lines of
both forms NVIDIA/nccl src/enqueue.cc writes, garbage, truncated and missing files."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodecheck.checks.bench import nccl_log
from nodecheck.checks.bench.nccl_log import algorithm_label, algorithms_in, read_segment

# NCCL 2.18-2.2x: rank 0 only, the algorithm by number, the size first.
OLD_FORM = """\
dgx01:48211:48211 [0] NCCL INFO Bootstrap : Using ibp24s0:10.0.0.1<0>
dgx01:48211:48211 [0] NCCL INFO 4 Bytes -> Algo 1 proto 0 time 8.610000
dgx01:48211:48211 [0] NCCL INFO 67108864 Bytes -> Algo 4 proto 2 time 201.548004
dgx01:48211:48211 [0] NCCL INFO 4 Bytes -> Algo 0 proto 0 time 6.400000
"""
# Newer releases: every rank, the name, no size.
NEW_FORM = """\
dgx01:51002:51002 [0] NCCL INFO Best tuning, algorithm, NVLSTree, protocol, Simple
dgx01:51002:51002 [0] NCCL INFO Best tuning, algorithm, Ring, protocol, LL128
"""


def test_the_old_form_by_number_at_the_payload_size() -> None:
    # 67108864 bytes ran NVLS (4); the 4-byte barriers' Ring and Tree are not the payload's.
    assert algorithms_in(OLD_FORM, 64 << 20) == ["nvls"]
    assert algorithm_label(OLD_FORM, 4) == "ring+tree"
    assert algorithm_label(OLD_FORM, 1 << 30) == "unknown"  # no line of that size


def test_the_new_form_by_name() -> None:
    assert algorithm_label(NEW_FORM, 64 << 20) == "nvls_tree+ring"
    for name, label in [
        ("Tree", "tree"),
        ("Ring", "ring"),
        ("CollNetDirect", "collnet_direct"),
        ("CollNetChain", "collnet_chain"),
        ("NVLS", "nvls"),
        ("NVLSTree", "nvls_tree"),
        ("PAT", "pat"),
    ]:
        line = f"h:1:2 [3] NCCL INFO Best tuning, algorithm, {name}, protocol, Simple\n"
        assert algorithm_label(line) == label


def test_every_algorithm_number_of_device_h() -> None:
    labels = [
        algorithm_label(f"h:1:1 [0] NCCL INFO 1024 Bytes -> Algo {n} proto 2 time 1.5\n", 1024)
        for n in range(7)
    ]
    assert labels == ["tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"]


def test_repeats_count_once_and_timestamps_do_not_matter() -> None:
    line = "[2026-12-01 10:00:00] h:1:2 [0] NCCL INFO Best tuning, algorithm, Ring, protocol, LL\n"
    assert algorithm_label(line * 3) == "ring"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage\n\x00\x01binary",
        "h:1:1 [0] NCCL INFO 1024 Bytes -> Algo 99 proto 2 time 1.5\n",  # no such number
        "h:1:1 [0] NCCL INFO Best tuning, algorithm, Hypercube, protocol, Simple\n",
        "h:1:1 [0] NCCL WARN Best tuning, algorithm, Ring, protocol, Simple\n",  # not INFO
        "h:1:1 [0] NCCL INFO Best tuning, algorithm, Ri",  # cut mid-line
        "Best tuning, algorithm, Ring, protocol, Simple\n",  # no NCCL prefix
    ],
)
def test_anything_else_is_unknown(text: str) -> None:
    assert algorithm_label(text, 1024) == "unknown"


def test_a_segment_of_the_file(tmp_path: Path) -> None:
    log = tmp_path / "nccl.dgx01.4242"
    log.write_text(OLD_FORM)
    start = nccl_log.log_size(log)
    with log.open("a") as more:
        more.write(NEW_FORM)
    assert algorithm_label(read_segment(log, start)) == "nvls_tree+ring"
    # From the start, the old form's line of that size too (the new form has no size).
    assert algorithm_label(read_segment(log, 0), 64 << 20) == "nvls+nvls_tree+ring"


def test_a_missing_or_truncated_file_is_unknown(tmp_path: Path) -> None:
    missing = tmp_path / "nccl.dgx01.1"
    assert nccl_log.log_size(missing) is None
    assert algorithm_label(read_segment(missing, 0)) == "unknown"
    assert read_segment(None, 0) == ""
    log = tmp_path / "nccl.dgx01.2"
    log.write_text(NEW_FORM)
    start = nccl_log.log_size(log)
    log.write_text("")  # truncated after the offset was taken
    assert algorithm_label(read_segment(log, start)) == "unknown"


def test_what_is_read_is_bounded(tmp_path: Path) -> None:
    """A tuning line past the bound is not read; a line cut by the bound is left out."""
    log = tmp_path / "nccl.dgx01.3"
    filler = "h:1:1 [0] NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7\n" * 4000
    log.write_text(filler + NEW_FORM)
    assert len(filler) > nccl_log.MAX_SEGMENT_BYTES
    assert algorithm_label(read_segment(log, 0)) == "unknown"
    cut = read_segment(log, len(filler), limit=len(NEW_FORM) - 5)
    assert cut == NEW_FORM.splitlines(keepends=True)[0]


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
        "dgx01:1:1 [0] NCCL INFO Best tuning, algorithm, Ring, protocol, LL\n"
        "dgx01:1:1 [0] NCCL WARN Cuda failure 'out of memory'\n"
        f"dgx01:1:1 [0] NCCL WARN {'x' * 1000}\n" + "dgx01:1:1 [0] NCCL WARN again\n" * 50
    )
    found = nccl_log.warnings_in(text)
    assert found[0] == "dgx01:1:1 [0] NCCL WARN Cuda failure 'out of memory'"
    assert len(found) == nccl_log.MAX_WARNINGS
    assert max(map(len, found)) == nccl_log.MAX_WARNING_CHARS
    assert nccl_log.warnings_in(NEW_FORM + OLD_FORM) == []
    (tmp_path / "nccl.a.1").write_text("")
    (tmp_path / "other").write_text("")
    assert nccl_log.log_files(tmp_path) == [tmp_path / "nccl.a.1"]
    assert nccl_log.log_files(tmp_path / "absent") == []
