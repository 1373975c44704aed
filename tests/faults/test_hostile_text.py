"""Fault matrix, hostile text: what the node, a job's environment, a capture, a file or the
command line says reaches a person's terminal escaped (checks/printable.py), never raw.

A job's NCCL_SOCKET_IFNAME with a newline would forge a report line in a `check` run as
root; OSC 0 (the window title), OSC 52 (the clipboard), CSI 2K with a CR (erase the line)
and the 8-bit CSI U+009B would drive root's terminal; U+202E would reorder what follows
it. Each output for people must show them as text, and the JSON must keep the real value.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodecheck.checks.node.facts import FactsError, loads
from tests.agent.test_cli import run
from tests.conftest import Node

FORGED = "FAIL forged"
# A newline and a forged report line, OSC 0, OSC 52, an erased line with a CR, U+202E
# (right-to-left override) and U+009B (CSI as one 8-bit control).
HOSTILE = f"\n{FORGED} \x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2K\r\u202e\x9b"
# How the hostile text's OSC 0 shows, escaped.
SHOWN = "\\x1b]0;pwned\\x07"

KeyPath = tuple[str | int, ...]


def assert_inert(text: str) -> None:
    """No character a terminal acts on but the newlines between lines, and no line that
    starts with the forged one."""
    raw = sorted({char for char in text if char != "\n" and not char.isprintable()})
    assert raw == [], f"raw control characters {raw!r} in:\n{text[:2000]}"
    forged = [line for line in text.split("\n") if line.lstrip().startswith(FORGED)]
    assert forged == [], forged


def string_paths(value: Any, path: KeyPath = ()) -> Iterator[KeyPath]:
    """The path to every string in a JSON document."""
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from string_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from string_paths(item, (*path, index))


def field_of(path: KeyPath) -> KeyPath:
    """The field a string is of: its path with list indices and the keys of a mapping by
    name or number (CPUs, bus ids, pids) as "*"."""
    return tuple("*" if isinstance(key, int) or not key.isidentifier() else key for key in path)


def appended(document: Any, paths: list[KeyPath]) -> Any:
    """A copy of the document with HOSTILE appended to the string at each path."""
    changed = copy.deepcopy(document)
    for path in paths:
        holder = changed
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] += HOSTILE
    return changed


def loadable(document: Any) -> bool:
    try:
        loads(json.dumps(document))
    except FactsError:
        return False
    return True


@pytest.fixture(scope="module")
def hostile_capture(dgx_faulty: Node, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `nodecheck capture` of the faulty replica (NVML's readings included), every string
    field of its parts with HOSTILE appended: each field whose strings the loader still
    takes (the cpulists it parses are refused, rightly), all of them at once."""
    done = run(*dgx_faulty.cli_args, "capture", env=dgx_faulty.env)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    fields: dict[KeyPath, list[KeyPath]] = {}
    for path in string_paths(document["parts"], ("parts",)):
        fields.setdefault(field_of(path), []).append(path)
    # A field whose value is one of a fixed set (a reading's `outcome`) is refused with
    # anything appended, rightly: it is no text shown as read.
    free = {field: paths for field, paths in fields.items() if field[-1] != "outcome"}
    taken = [field for field, paths in free.items() if loadable(appended(document, paths))]
    assert len(free) > 60 and len(taken) >= 0.9 * len(free), sorted(set(free) - set(taken))
    hostile = appended(document, [path for field in taken for path in fields[field]])
    assert loadable(hostile)
    capture = tmp_path_factory.mktemp("hostile") / "capture.json"
    capture.write_text(json.dumps(hostile))
    return capture


@pytest.mark.parametrize(
    "command",
    [["check"], ["inventory"], ["tune", "--format", "text"], ["tune", "--format", "shell"]],
    ids=["check", "inventory", "tune_text", "tune_shell"],
)
def test_every_string_of_a_capture_is_shown_escaped(
    hostile_capture: Path, command: list[str]
) -> None:
    """`check`, `inventory` and `tune` on a capture whose every string field ends in a
    newline, a forged report line and escape sequences: each runs (not refused), shows
    the values escaped, no raw control character and no forged line."""
    done = run(*command, "--facts", str(hostile_capture))
    assert done.returncode in (0, 1, 3), done.stderr
    assert SHOWN in done.stdout  # the values were shown, as text
    assert_inert(done.stdout)
    assert_inert(done.stderr)


def test_a_job_environment_cannot_forge_a_line_of_a_live_check(
    dgx_faulty: Node, copy_node: Callable[[Node], Node]
) -> None:
    """A job on the GPUs sets NCCL_SOCKET_IFNAME to a newline, a forged line and escape
    sequences: the live `check` table shows it escaped; the JSON keeps the real value."""
    node = copy_node(dgx_faulty)
    value = f"eth0{HOSTILE}"
    (node.root / "proc" / "4242" / "environ").write_bytes(
        b"PATH=/usr/bin\0NCCL_SOCKET_IFNAME=" + value.encode() + b"\0"
    )
    done = run(*node.cli_args, "check", env=node.env)
    assert done.returncode == 1, done.stderr
    assert f"NCCL_SOCKET_IFNAME=eth0\\n{FORGED} {SHOWN}" in done.stdout
    assert_inert(done.stdout)
    assert_inert(done.stderr)
    as_json = run(*node.cli_args, "check", "--json", "--only", "nccl_env", env=node.env)
    assert as_json.stdout.isascii()  # json.dumps escapes every control character
    [result] = json.loads(as_json.stdout)["results"]
    assert f"NCCL_SOCKET_IFNAME={value}" in result["summary"]


def _capture_with_part(name: str) -> str:
    return json.dumps(
        {"schema": "nodecheck.facts/v1", "taken_at": 1.0, "parts": {name: {"value": {}}}}
    )


@pytest.mark.parametrize(
    "where",
    ["check_only", "extra_argument", "facts_part", "sysfs_root", "nvml_library", "config_file"],
)
def test_an_error_quoting_a_hostile_name_shows_it_escaped(tmp_path: Path, where: str) -> None:
    """A usage error that names what it refuses (an unknown check, an extra argument, a
    capture's unknown part, a root, a library or a configuration file whose name holds
    ESC and a newline): exit 2, the name escaped, no forged line."""
    name = f"x{HOSTILE}"
    hostile_file = tmp_path / name
    if where == "check_only":
        argv = ["check", "--only", name]
    elif where == "extra_argument":  # click's own message, which quotes it as it is
        argv = ["check", name]
    elif where == "facts_part":
        hostile_file.write_text(_capture_with_part(name))
        argv = ["check", "--facts", str(hostile_file)]
    elif where == "sysfs_root":
        argv = ["--sysfs-root", str(hostile_file), "check"]
    elif where == "nvml_library":
        os.mkfifo(hostile_file)
        argv = ["--nvml-library", str(hostile_file), "check"]
    else:
        hostile_file.write_text("[agent]\nnvml_timeout = 99\n")
        argv = ["config", "check", str(hostile_file)]
    done = run(*argv)
    assert done.returncode == 2, done.stderr
    assert SHOWN in done.stderr, done.stderr
    assert_inert(done.stderr)
    assert_inert(done.stdout)


def test_a_log_line_shows_a_hostile_value_escaped() -> None:
    """A value logged with %s (a path, a client's address): one line, escaped."""
    program = (
        "import logging, sys\n"
        "from nodecheck.agent.logs import configure_logging\n"
        "configure_logging('info')\n"
        "logging.getLogger('nodecheck.test').warning('event=x path=%s', sys.argv[1])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, HOSTILE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stderr.splitlines()) == 1 and SHOWN in done.stderr, done.stderr
    assert_inert(done.stderr)


def test_config_show_escapes_what_a_terminal_acts_on_and_reads_back(tmp_path: Path) -> None:
    """A path in the configuration with U+202E, U+009B, DEL and an ESC: `config show` writes
    each as a TOML escape, which reads back as the same value (shown again, the same)."""
    state_dir = f"{tmp_path}/a\u202eb\x9bc\x7fd\x1b]0;pwned\x07"
    Path(state_dir).mkdir()  # a configured state_dir must exist
    config = tmp_path / "c.toml"
    config.write_text(f"[agent]\nstate_dir = {json.dumps(state_dir)}\n")
    shown = run("config", "show", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert_inert(shown.stdout)
    escaped = "a\\u202eb\\u009bc\\u007fd\\u001b]0;pwned\\u0007"
    assert f'state_dir = "{tmp_path}/{escaped}"' in shown.stdout
    again = tmp_path / "shown.toml"
    again.write_text(shown.stdout)
    reread = run("config", "show", "--config", str(again))
    assert reread.returncode == 0, reread.stderr
    assert reread.stdout.split("\n")[1:] == shown.stdout.split("\n")[1:]  # but the source line
