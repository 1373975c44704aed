"""Each default is declared once, in checks/config.py: the command's options, the agent's
configuration and `nodecheck config show` all start from CheckConfig's."""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from nodecheck.agent import config as config_module
from nodecheck.agent.cli import cli
from nodecheck.agent.cli.options import check_config, settings
from nodecheck.agent.config import AgentConfig, load_config
from nodecheck.checks.config import (
    AGENT_IDLE_WINDOW_S,
    DEFAULT_NVML_TIMEOUT_S,
    BenchOptions,
    CheckConfig,
)
from nodecheck.checks.registry import load_checks
from tests.agent.test_cli import run

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent.parent
# Where nodecheck's own code lives (tests may write any number they like).
SOURCE_DIRS = ("agent", "checks", "tuning", "main", "bench", "tools")
# The one module allowed to write the NVML timeout's default.
DECLARING_MODULE = Path("checks/config.py")
DEFAULTS = CheckConfig()


def command_named(name: str) -> click.Command:
    """A command of `nodecheck`, imported as running it would (agent/cli/lazy.py)."""
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, name
    return command


def default_of(command: click.Command, name: str) -> object:
    """What the command gets for option `name` when it is not given."""
    [param] = [param for param in command.params if param.name == name]
    return param.get_default(click.Context(command))


def test_the_bench_options_defaults_are_bench_options() -> None:
    bench = command_named("bench")
    options = DEFAULTS.bench
    # Each option of `nodecheck bench`, and the BenchOptions value it sets.
    expected = {
        "dtype": options.dtype,
        "duration": options.duration_s,
        "device": options.device,
        "processes": options.processes,
        "idle_window": options.idle_window_s,
        "warn_below": options.thresholds.warn,
        "fail_below": options.thresholds.fail,
        "memory_fraction": options.memory_fraction,
        "idle_utilization": options.idle_utilization_pct,
        "maintenance_file": options.maintenance_file,
        "force": options.force,
        "gpus": options.gpus,
    }
    assert {name: default_of(bench, name) for name in expected} == expected
    # No --state-dir: BenchOptions' own (root's /var/lib/nodecheck or the user's).
    assert default_of(bench, "state_dir") is None


def test_the_snapshot_output_default_is_the_one_whose_folder_is_created() -> None:
    """`snapshot` creates the folder of its default output only (its own /run/nodecheck)."""
    from nodecheck.agent.daemon.snapshot import DEFAULT_SNAPSHOT_PATH

    assert default_of(command_named("snapshot"), "output") == DEFAULT_SNAPSHOT_PATH


def test_the_check_options_defaults_are_check_configs() -> None:
    assert default_of(command_named("check"), "expected_gpus") == DEFAULTS.expected_gpus
    # --nvml-timeout is left None when not given (an option given wins over the agent's
    # file); what a command then uses is settings()' value, and its help says so.
    assert settings(click.Context(cli))["nvml_timeout"] == DEFAULTS.nvml_timeout_s
    assert check_config(click.Context(cli)) == DEFAULTS
    help_text = " ".join(run("check", "--help").stdout.split())
    assert f"bus can hang them. [default: {DEFAULTS.nvml_timeout_s:g}]" in help_text, help_text


def test_the_agents_defaults_are_check_configs() -> None:
    """The agent judges under the checks' defaults but one: it waits longer for idle GPUs."""
    expected = CheckConfig(bench=BenchOptions(idle_window_s=AGENT_IDLE_WINDOW_S))
    assert DEFAULTS.bench.idle_window_s != AGENT_IDLE_WINDOW_S
    assert AgentConfig().check_config() == expected
    assert load_config(None, set(load_checks())).check_config() == expected


def test_config_show_on_an_empty_file_prints_the_check_configs_defaults(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    done = run("config", "show", "--config", str(empty))
    assert done.returncode == 0, done.stderr
    shown = tomllib.loads(done.stdout)
    agent, benchmarks = shown["agent"], shown["benchmarks"]
    options = DEFAULTS.bench
    assert agent["nvml_timeout"] == DEFAULTS.nvml_timeout_s
    assert "expected_gpus" not in agent and DEFAULTS.expected_gpus is None
    assert benchmarks["duration"] == options.duration_s
    assert benchmarks["device"] == options.device
    assert benchmarks["warn_below"] == options.thresholds.warn
    assert benchmarks["fail_below"] == options.thresholds.fail
    assert benchmarks["memory_fraction"] == options.memory_fraction
    assert benchmarks["network_max_age"] == options.network_max_age_s
    assert benchmarks["idle_window"] == AGENT_IDLE_WINDOW_S


def _keys_shown(text: str) -> dict[str, set[str]]:
    """The keys of each table of `config show`'s text, set or commented out as unset
    (`# key = ...  (unset: ...)`)."""
    keys: dict[str, set[str]] = {}
    table = ""
    for line in text.splitlines():
        header = re.fullmatch(r"\[([a-z_.]+)\]", line)
        if header:
            table = header.group(1)
            keys.setdefault(table, set())
            continue
        key = re.match(r"(?:# )?([A-Za-z_]+) = ", line)
        if key and table:
            keys[table].add(key.group(1))
    return keys


def test_config_show_prints_every_key_and_reads_back(tmp_path: Path) -> None:
    """`config show` on an empty file: every key agent/config.py's example documents
    (checks.pcie_acs standing for each registered check), each check with its own interval
    and timeout, and keys left unset commented out as such; its output is itself a
    configuration `config check` accepts, and shows the same again. It left out the checks,
    expected_gpus, kernel_log, state_dir, snapshot and the TLS and users files."""
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    done = run("config", "show", "--config", str(empty))
    assert done.returncode == 0, done.stderr
    example = config_module.__doc__.split("\n\n", 2)[2].split("\n\nA bad file", 1)[0]
    documented = tomllib.loads(textwrap.dedent(example))
    shown = _keys_shown(done.stdout)
    checks = load_checks()
    for table, keys in documented.items():
        if table == "checks":  # [checks.pcie_acs]: what every check's table takes
            for name in checks:
                assert set(keys["pcie_acs"]) <= shown[f"checks.{name}"], name
        elif table == "labels":  # any names: shown as NAME when there are none
            assert shown[table] == {"NAME"}
        else:
            assert set(keys) <= shown[table], (table, set(keys) - shown[table])
    settings = tomllib.loads(done.stdout)["checks"]
    assert settings == {
        name: {"enabled": True, "interval": check.interval_s, "timeout": check.timeout_s}
        for name, check in checks.items()
    }
    assert "# expected_gpus = ...  (unset: the GPUs on the PCI bus" in done.stdout
    assert "# state_dir = ...  (unset: /var/lib/nodecheck as root, else " in done.stdout
    again = tmp_path / "shown.toml"
    again.write_text(done.stdout)
    checked = run("config", "check", str(again))
    assert checked.returncode == 0 and checked.stdout == f"{again}: ok\n", checked.stderr
    reshown = run("config", "show", "--config", str(again))
    assert reshown.stdout.split("\n", 1)[1] == done.stdout.split("\n", 1)[1]


def _mentions_nvml_timeout(name: str | None) -> bool:
    lowered = (name or "").lower()
    if "request" in lowered or "response" in lowered:
        return False  # the HTTP server's own clocks (agent/web/intake.py), not NVML's
    return "nvml" in lowered or "deadline" in lowered


def _is_the_default(node: ast.expr | None) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
        and node.value == DEFAULT_NVML_TIMEOUT_S
    )


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Attribute):
        yield target.attr
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _target_names(element)


def nvml_timeout_literals(source: str) -> Iterator[int]:
    """The lines where `source` writes the NVML timeout's default as a number: assigned
    to a name about NVML or a deadline, passed as such a keyword or parameter default,
    or given to a call that names NVML (click.option("--nvml-timeout", default=...),
    settings.get("nvml_timeout", ...))."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [name for target in targets for name in _target_names(target)]
            if _is_the_default(node.value) and any(map(_mentions_nvml_timeout, names)):
                yield node.lineno
        elif isinstance(node, ast.arguments):
            positional = [*node.posonlyargs, *node.args]
            pairs = [
                *zip(
                    positional[len(positional) - len(node.defaults) :], node.defaults, strict=True
                ),
                *zip(node.kwonlyargs, node.kw_defaults, strict=True),
            ]
            for argument, default in pairs:
                if _is_the_default(default) and _mentions_nvml_timeout(argument.arg):
                    yield argument.lineno
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if _is_the_default(keyword.value) and _mentions_nvml_timeout(keyword.arg):
                    yield keyword.value.lineno
            named = [
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            ]
            values = [*node.args, *(keyword.value for keyword in node.keywords)]
            if any(map(_mentions_nvml_timeout, named)):
                yield from (value.lineno for value in values if _is_the_default(value))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(key.value, str)
                    and _mentions_nvml_timeout(key.value)
                    and _is_the_default(value)
                ):
                    yield value.lineno


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("DEFAULT_NVML_TIMEOUT_S = {d}\n", [1]),
        ("class C:\n    nvml_timeout_s: float = {d}\n", [2]),
        ("NvmlSession(\n    deadline_s={d})\n", [2]),
        ("def f(*, deadline_s: float = {d}) -> None: ...\n", [1]),
        ("def f(x, nvml_timeout={d}, y=1) -> None: ...\n", [1]),
        ('click.option("--nvml-timeout", default={d})\n', [1]),
        ('chosen.get("nvml_timeout", {d})\n', [1]),
        ('{{"nvml_timeout": {d}}}\n', [1]),
        # The same number meaning something else, and other numbers, are not it.
        ("GPU_LOST_SAME_WITHIN_S = {d}\nSPEEDS = (2.5, {d})\nx = f(1, {d})\n", []),
        ("nvml_timeout_s = DEFAULT_NVML_TIMEOUT_S\ndeadline_s = {other}\n", []),
        ('click.option("--nvml-timeout", default=None)\n', []),
    ],
)
def test_the_literal_finder_on_literal_sources(source: str, lines: list[int]) -> None:
    text = source.format(d=repr(DEFAULT_NVML_TIMEOUT_S), other=DEFAULT_NVML_TIMEOUT_S + 1)
    assert list(nvml_timeout_literals(text)) == lines, text


def test_no_module_but_checks_config_writes_the_nvml_timeout_default() -> None:
    files = sorted(
        path
        for directory in SOURCE_DIRS
        for path in (ROOT / directory).rglob("*.py")
        if path.relative_to(ROOT) != DECLARING_MODULE
    )
    assert len(files) > 50 and ROOT / "agent" / "cli" / "options.py" in files
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in files
        for line in nvml_timeout_literals(path.read_text())
    ]
    assert offenders == []
    # The finder does find the declaration itself.
    assert list(nvml_timeout_literals((ROOT / DECLARING_MODULE).read_text()))
