"""agent/daemon/results_file.py: how a failed write is said."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nodecheck.agent.daemon import results_file
from nodecheck.agent.daemon.results_file import ResultsFile


def test_the_default_folder_missing_is_said_once_and_is_no_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent run by hand (`make run`: no /run/nodecheck/agent) writes no results file:
    one info line says so, not one a run, and /healthz has nothing against it."""
    default = tmp_path / "absent" / "results.json"
    monkeypatch.setattr(results_file, "DEFAULT_RESULTS_FILE", default)
    written = ResultsFile(lambda: default)
    with caplog.at_level(logging.INFO, logger=results_file.__name__):
        for _ in range(5):
            written.write("{}\n")
    said = [r for r in caplog.records if "results_write_failed" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    assert written.state() is None and written.health_problem() is None
    (tmp_path / "absent").mkdir()
    written.write("{}\n")
    assert default.read_text() == "{}\n"
    assert written.state() == results_file.ResultsWrites(0, None)
