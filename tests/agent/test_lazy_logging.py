"""nodecheck's loggers import logging at their first record (checks/lazy_logging.py), and
the handler the command configured (agent/logs.py) is in place before that record."""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from nodecheck.checks.lazy_logging import DEBUG, ERROR, INFO, WARNING, get_logger
from tests.conftest import Node

ROOT = Path(__file__).resolve().parent.parent.parent


def python(program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_healthy_check_never_imports_logging(dgx: Node) -> None:
    """`check --json` on a healthy node logs nothing, so it never pays for logging."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "nodecheck", *dgx.cli_args, "check", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **dgx.env},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["status"] == "ok"
    imported = [line.rpartition("|")[2].strip() for line in done.stderr.splitlines()]
    assert "nodecheck.checks.runner" in imported  # the checks ran in this process
    assert "logging" not in imported and "traceback" not in imported


def test_the_first_record_sets_up_the_handler() -> None:
    """Configured before any record: logging is not imported until a record is made, and
    that record is the command's key=value line, at the configured level."""
    done = python(
        "import sys\n"
        "from nodecheck.agent.logs import configure_logging\n"
        "from nodecheck.checks.lazy_logging import get_logger\n"
        "configure_logging('info')\n"
        "print('logging' in sys.modules)\n"
        "log = get_logger('nodecheck.test')\n"
        "log.debug('event=hidden')\n"
        "log.info('event=shown n=%d', 3)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "False\n"
    assert done.stderr == "level=info logger=nodecheck.test event=shown n=3\n"


def test_a_set_up_after_a_record_applies_at_once() -> None:
    """A logger used before the command configured logging: the configuration applies to
    the next record (nothing waits for a "first" record that already came)."""
    done = python(
        "from nodecheck.agent.logs import configure_logging\n"
        "from nodecheck.checks.lazy_logging import get_logger\n"
        "log = get_logger('nodecheck.early')\n"
        "log.debug('event=before')\n"
        "configure_logging('debug')\n"
        "log.debug('event=after')\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "level=debug logger=nodecheck.early event=after\n"


def test_a_thread_that_dies_first_is_one_line() -> None:
    """A thread's crash as the first record, logging not yet imported: the set-up comes
    first, so it is one key=value line, never Python's traceback."""
    done = python(
        "import sys, threading\n"
        "from nodecheck.agent.logs import configure_logging\n"
        "configure_logging('warning')\n"
        "def crash():\n"
        "    raise ValueError('in a thread')\n"
        "worker = threading.Thread(target=crash, name='worker')\n"
        "assert 'logging' not in sys.modules\n"
        "worker.start()\n"
        "worker.join()\n"
    )
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("level=error logger=nodecheck event=thread_crashed thread=worker")
    assert "exception=ValueError error='in a thread'" in line


def test_a_set_up_that_failed_is_tried_again() -> None:
    """A set-up interrupted mid-way (a signal during the first record) stays pending: the
    next record installs the handler, rather than every record going unformatted."""
    done = python(
        "from nodecheck.agent.logs import configure_logging\n"
        "from nodecheck.checks import lazy_logging\n"
        "configure_logging('info')\n"
        "configured = lazy_logging._setup.pending\n"
        "tries = []\n"
        "def flaky():\n"
        "    tries.append(1)\n"
        "    if len(tries) == 1:\n"
        "        raise KeyboardInterrupt\n"
        "    configured()\n"
        "lazy_logging.install_before_first_record(flaky)\n"
        "log = lazy_logging.get_logger('nodecheck.test')\n"
        "try:\n"
        "    log.info('event=lost')\n"
        "except KeyboardInterrupt:\n"
        "    pass\n"
        "log.info('event=kept')\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "level=info logger=nodecheck.test event=kept\n"


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_record_is_logging_s_own_and_names_its_caller() -> None:
    """The same logger logging.getLogger gives (a test's caplog, an operator's set-up),
    the same levels, and a record names the line that made it, not the wrapper."""
    assert (DEBUG, INFO, WARNING, ERROR) == (
        logging.DEBUG,
        logging.INFO,
        logging.WARNING,
        logging.ERROR,
    )
    name = "nodecheck.test_lazy_logging"
    real = logging.getLogger(name)
    kept = Kept()
    real.addHandler(kept)
    real.setLevel(logging.INFO)
    try:
        log = get_logger(name)
        assert not log.enabled_for(DEBUG) and log.enabled_for(INFO)
        log.debug("event=hidden")
        try:
            raise OSError("no disk")
        except OSError as err:
            log.log(WARNING, "event=x n=%d", 2, exc_info=err)
    finally:
        real.removeHandler(kept)
        real.setLevel(logging.NOTSET)
    [record] = kept.records
    assert record.getMessage() == "event=x n=2" and record.levelno == logging.WARNING
    assert record.exc_info is not None and isinstance(record.exc_info[1], OSError)
    assert record.pathname == __file__
    assert record.funcName == "test_a_record_is_logging_s_own_and_names_its_caller"


def test_every_logger_comes_from_lazy_logging() -> None:
    """No nodecheck module imports logging (or a part of it), at its top or in a function,
    nor asks logging for a logger: each takes get_logger's, so the handler is set up
    before its record. Only agent/logs.py's handler set-up and lazy_logging itself
    import it, when used."""
    offenders = []
    for folder in ("agent", "checks", "tuning"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = path.relative_to(ROOT)
            if str(where) in ("agent/logs.py", "checks/lazy_logging.py"):
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    modules = [node.module or ""]
                elif isinstance(node, ast.Attribute | ast.Name):
                    name = node.attr if isinstance(node, ast.Attribute) else node.id
                    if name == "getLogger":
                        offenders.append(f"{where}:{node.lineno} calls getLogger")
                    continue
                else:
                    continue
                if any(module.split(".")[0] == "logging" for module in modules):
                    offenders.append(f"{where}:{node.lineno} imports logging")
    assert offenders == []
