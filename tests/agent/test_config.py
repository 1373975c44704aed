"""The agent's configuration: defaults, a file over them, and bad files named precisely."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodecheck.agent.config import AgentConfig, ConfigError, load_config, parse_config
from nodecheck.checks.registry import load_checks
from tests.agent.test_cli import run
from tests.faults.test_config import NUMERIC_KEYS, refused, write

CHECKS = set(load_checks())
GOOD = """\
# a node of the training cluster
[agent]
listen = "127.0.0.1:19410"
textfile_dir = "{textfile}"
expected_gpus = 8

[checks.pcie_acs]
interval = 600

[checks.cpu]
enabled = false

[benchmarks]
enabled = true
device = "cpu"
"""


def test_embedded_defaults_need_no_file() -> None:
    config = load_config(None, CHECKS)
    assert config == AgentConfig()
    assert config.listen == ":19410" and config.check("gpu_xid").enabled


def good(tmp_path: Path) -> str:
    """GOOD, its textfile directory made (a textfile_dir must exist and be writable)."""
    textfile = tmp_path / "textfile"
    textfile.mkdir(exist_ok=True)
    return GOOD.format(textfile=textfile)


def test_a_file_over_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(good(tmp_path))
    config = load_config(path, CHECKS)
    assert config.listen == "127.0.0.1:19410" and config.expected_gpus == 8
    assert config.check("pcie_acs").interval_s == 600 and not config.check("cpu").enabled
    assert config.benchmarks.enabled and config.benchmarks.device == "cpu"
    # show() prints TOML that reads back to the same configuration.
    again = parse_config(config.show(), path, CHECKS)
    assert again == config


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[agent]\nlisten = "nope"\n', "c.toml:2: agent.listen: expected host:port"),
        (
            "[agent]\nexpected_gpus = true\n",
            "c.toml:2: agent.expected_gpus: expected an integer, got true",
        ),
        ("[agent]\nexpected_gpu = 8\n", "c.toml:2: agent.expected_gpu: unknown key"),
        ("\n[checks.pcie_acss]\ninterval = 5\n", "c.toml:2: checks.pcie_acss: no check named"),
        (
            "[checks.numa]\n\ninterval = -5\n",
            "c.toml:3: checks.numa.interval: must be from 1 to 2592000 seconds (30 days), got -5",
        ),
        (
            "[agent]\nnvml_timeout = 30\n",
            "c.toml:2: agent.nvml_timeout: must be from 0.1 to 8 seconds, got 30",
        ),
        ('[benchmarks]\ndevice = "tpu"\n', 'c.toml:2: benchmarks.device: expected "cuda" or "cpu"'),
        ("[agent\nlisten = 1\n", "c.toml:1: "),
        ("[agents]\n", "c.toml:1: agents: unknown key"),
        ('[agent]\nlisten = ":99999"\n', "c.toml:2: agent.listen: port 99999 out of range"),
        (
            '[agent]\ntls_cert_file = "/nonexistent.crt"\ntls_key_file = "/nonexistent.key"\n',
            "c.toml:2: agent.tls_cert_file: /nonexistent.crt: no such file",
        ),
        ("[benchmarks]\nwarn_below = 0.7\nfail_below = 0.8\n", "c.toml:3: benchmarks.fail_below"),
        (
            "[benchmarks]\nmemory_fraction = 2\n",
            "c.toml:2: benchmarks.memory_fraction: must be from 0.01 to 0.95, got 2",
        ),
    ],
)
def test_bad_files_name_file_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, CHECKS)
    assert str(caught.value).startswith(str(tmp_path / message)), str(caught.value)


def test_config_commands(tmp_path: Path) -> None:
    path = tmp_path / "good.toml"
    path.write_text(good(tmp_path))
    done = run("config", "check", str(path))
    assert done.returncode == 0 and done.stdout == f"{path}: ok\n"
    shown = run("config", "show", "--config", str(path))
    assert shown.returncode == 0 and 'listen = "127.0.0.1:19410"' in shown.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent]\nlisten = 19410\n")
    done = run("config", "check", str(bad))
    assert done.returncode == 2
    assert done.stderr == (
        f"nodecheck: bad configuration: {bad}:2: agent.listen: expected a string, "
        "got an integer 19410\n"
    )
    assert run("config", "check", str(tmp_path / "missing.toml")).returncode == 2


# TOML literals of the wrong type for a number.
WRONG_TYPE = ['"5"', "{ a = 1 }", "[1, 2]", "true", "1979-05-27T07:32:00Z", "07:32:00"]


@pytest.mark.parametrize("literal", WRONG_TYPE)
@pytest.mark.parametrize(("table", "key", "allowed"), NUMERIC_KEYS)
def test_a_number_of_the_wrong_type_says_what_it_got(
    tmp_path: Path, table: str, key: str, allowed: str, literal: str
) -> None:
    """A string, a table, an array, a bool, a date-time where a number goes."""
    path = write(tmp_path / "c.toml", f"[{table}]\n{key} = {literal}\n")
    message = refused(path)
    assert message.startswith(f"{path}:2: {table}.{key}: expected "), message
    assert "got " in message and len(message) < 300, message


def test_a_snapshot_that_is_not_there_yet_is_fine(tmp_path: Path) -> None:
    """nodecheck-snapshot.timer writes it later (and creates /run/nodecheck): neither the
    file nor its directory need exist when the agent starts."""
    path = write(tmp_path / "c.toml", f'[agent]\nsnapshot = "{tmp_path}/run/snapshot.json"\n')
    assert load_config(path, CHECKS).snapshot == tmp_path / "run" / "snapshot.json"
