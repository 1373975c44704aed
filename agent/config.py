"""The agent's configuration: embedded defaults, optionally overridden by a TOML file.

    [agent]
    listen = ":19410"            # host:port for /metrics, /healthz, /results; "" for none
    textfile_dir = ""            # also write nodecheck.prom there (node_exporter's textfile)
    expected_gpus = 8
    kernel_log = "/dev/kmsg"
    nvml_timeout = 5.0
    state_dir = "/var/lib/nodecheck"
    snapshot = "/run/nodecheck/snapshot.json"   # root-only checks, from nodecheck snapshot
    tls_cert_file = ""           # HTTPS when both are set
    tls_key_file = ""
    basic_auth_file = ""         # "user:<bcrypt hash>" lines, as htpasswd -B writes them

    [checks.pcie_acs]            # any registered check
    enabled = true
    interval = 300               # seconds
    timeout = 10

    [benchmarks]
    enabled = false
    interval = 86400
    duration = 4.0
    device = "cuda"
    idle_window = 60.0           # seconds every GPU must be idle before one starts
    warn_below = 0.9             # ratio to the node's median GPU and to the baseline
    fail_below = 0.8
    memory_fraction = 0.5        # of each GPU's free memory

A bad file is refused whole, with the file, line and key named: the agent
keeps running on what it had.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_PATH = Path("/etc/nodecheck/config.toml")
DEFAULT_PORT = 19410


class ConfigError(Exception):
    """A configuration that cannot be used: where, and why."""

    def __init__(self, path: Path | str, line: int | None, key: str, reason: str) -> None:
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {key}: {reason}" if key else f"{where}: {reason}")


@dataclass(frozen=True)
class CheckSettings:
    enabled: bool = True
    interval_s: float | None = None  # None: the check's own default
    timeout_s: float | None = None


@dataclass(frozen=True)
class BenchmarkSettings:
    enabled: bool = False
    interval_s: float = 86400.0
    duration_s: float = 4.0
    device: str = "cuda"
    idle_window_s: float = 60.0  # the agent waits a minute of idleness, the CLI two seconds
    warn_below: float = 0.9  # ratios to the node's median and the baseline
    fail_below: float = 0.8
    memory_fraction: float = 0.5


@dataclass(frozen=True)
class AgentConfig:
    source: str = "embedded defaults"
    listen: str = f":{DEFAULT_PORT}"
    textfile_dir: Path | None = None
    expected_gpus: int | None = None
    kernel_log: Path | None = None
    nvml_timeout_s: float = 5.0
    state_dir: Path | None = None
    # The root snapshot (nodecheck-snapshot.timer) the agent serves root-only checks from.
    snapshot: Path | None = None
    # HTTPS and basic auth for /metrics and /results (as Prometheus exporters' web config).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    basic_auth_file: Path | None = None  # "user:<bcrypt hash>" lines (htpasswd -B)
    checks: dict[str, CheckSettings] = field(default_factory=dict)
    benchmarks: BenchmarkSettings = field(default_factory=BenchmarkSettings)

    def check(self, name: str) -> CheckSettings:
        return self.checks.get(name, CheckSettings())

    def show(self) -> str:
        """The effective configuration, as TOML."""
        lines = [f"# effective configuration ({self.source})", "[agent]"]
        lines.append(f'listen = "{self.listen}"')
        lines.append(f'textfile_dir = "{self.textfile_dir or ""}"')
        if self.expected_gpus is not None:
            lines.append(f"expected_gpus = {self.expected_gpus}")
        if self.kernel_log is not None:
            lines.append(f'kernel_log = "{self.kernel_log}"')
        lines.append(f"nvml_timeout = {self.nvml_timeout_s}")
        if self.state_dir is not None:
            lines.append(f'state_dir = "{self.state_dir}"')
        if self.snapshot is not None:
            lines.append(f'snapshot = "{self.snapshot}"')
        for key, value in (
            ("tls_cert_file", self.tls_cert_file),
            ("tls_key_file", self.tls_key_file),
            ("basic_auth_file", self.basic_auth_file),
        ):
            if value is not None:
                lines.append(f'{key} = "{value}"')
        for name, settings in sorted(self.checks.items()):
            lines += ["", f"[checks.{name}]", f"enabled = {str(settings.enabled).lower()}"]
            if settings.interval_s is not None:
                lines.append(f"interval = {settings.interval_s}")
            if settings.timeout_s is not None:
                lines.append(f"timeout = {settings.timeout_s}")
        bench = self.benchmarks
        lines += [
            "",
            "[benchmarks]",
            f"enabled = {str(bench.enabled).lower()}",
            f"interval = {bench.interval_s}",
            f"duration = {bench.duration_s}",
            f'device = "{bench.device}"',
            f"idle_window = {bench.idle_window_s}",
            f"warn_below = {bench.warn_below}",
            f"fail_below = {bench.fail_below}",
            f"memory_fraction = {bench.memory_fraction}",
        ]
        return "\n".join(lines) + "\n"


def key_line(text: str, table: tuple[str, ...], key: str | None) -> int | None:
    """The line of `key` in `[table]` (or of the table header when key is None)."""
    current: tuple[str, ...] = ()
    header = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")
    for number, line in enumerate(text.splitlines(), start=1):
        match = header.match(line)
        if match:
            current = tuple(part.strip().strip('"') for part in match.group(1).split("."))
            if key is None and current == table:
                return number
            continue
        if (
            key is not None
            and current == table
            and re.match(rf"^\s*\"?{re.escape(key)}\"?\s*=", line)
        ):
            return number
    return None


class _Reader:
    """Takes values out of one parsed table, checking each one's type."""

    def __init__(self, path: Path, text: str, table: tuple[str, ...], data: dict[str, Any]):
        self.path, self.text, self.table, self.data = path, text, table, dict(data)

    def fail(self, key: str | None, reason: str) -> ConfigError:
        line = key_line(self.text, self.table, key)
        if line is None and key is not None:  # a table, not a value: [agent.extra]
            line = key_line(self.text, (*self.table, key), None)
        dotted = ".".join((*self.table, key) if key else self.table)
        return ConfigError(self.path, line, dotted, reason)

    def take(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        if key not in self.data:
            return default
        value = self.data.pop(key)
        # bool is an int in Python; a number where a bool goes (or the reverse) is a mistake.
        kinds = kind if isinstance(kind, tuple) else (kind,)
        wrong_bool = isinstance(value, bool) and bool not in kinds
        if wrong_bool or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.fail(key, f"expected {names}, got {value!r}")
        return value

    def positive(self, key: str, default: float | None) -> float | None:
        value = self.take(key, (int, float), default)
        if value is not None and value <= 0:
            raise self.fail(key, f"must be greater than 0, got {value!r}")
        return None if value is None else float(value)

    def done(self) -> None:
        for key in self.data:
            raise self.fail(key, "unknown key")


def _unusable(key: str, path: Path) -> str | None:
    """Why a file the configuration names cannot be used, or None."""
    try:
        text = path.read_text()
    except OSError as err:
        return f"{path}: {err.strerror or err}"
    if key == "basic_auth_file":
        from nodecheck.agent.exporter import parse_basic_auth

        try:
            parse_basic_auth(text, str(path))
        except ValueError as err:
            return str(err)
    if key == "tls_cert_file" and "BEGIN CERTIFICATE" not in text:
        return f"{path}: not a PEM certificate"
    if key == "tls_key_file" and "PRIVATE KEY" not in text:
        return f"{path}: not a PEM private key"
    return None


def parse_config(text: str, path: Path, known_checks: set[str]) -> AgentConfig:
    """AgentConfig from TOML text; ConfigError naming the file, line and key."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        match = re.search(r"line (\d+)", str(err))
        raise ConfigError(path, int(match.group(1)) if match else None, "", str(err)) from err
    config = AgentConfig(source=str(path))
    root = _Reader(path, text, (), document)
    agent = root.take("agent", dict, {})
    checks = root.take("checks", dict, {})
    benchmarks = root.take("benchmarks", dict, {})
    root.done()

    section = _Reader(path, text, ("agent",), agent)
    listen = section.take("listen", str, config.listen)
    if listen and not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[\w.-]*):\d{1,5}", listen):
        raise section.fail("listen", f"expected host:port (or :port), got {listen!r}")
    if listen and not 0 < int(listen.rpartition(":")[2]) < 65536:
        raise section.fail("listen", f"port out of range in {listen!r}")
    textfile = section.take("textfile_dir", str, "")
    expected = section.take("expected_gpus", int, None)
    if expected is not None and expected < 0:
        raise section.fail("expected_gpus", f"must be 0 or more, got {expected}")
    kernel_log = section.take("kernel_log", str, None)
    timeout = section.positive("nvml_timeout", config.nvml_timeout_s)
    if timeout is not None and timeout > 8:
        raise section.fail("nvml_timeout", "must be at most 8 seconds (checks time out at 30)")
    state_dir = section.take("state_dir", str, None)
    snapshot = section.take("snapshot", str, None)
    web = {
        key: section.take(key, str, None)
        for key in ("tls_cert_file", "tls_key_file", "basic_auth_file")
    }
    if bool(web["tls_cert_file"]) != bool(web["tls_key_file"]):
        missing = "tls_key_file" if web["tls_cert_file"] else "tls_cert_file"
        raise section.fail(missing, "TLS needs both tls_cert_file and tls_key_file")
    for key, value in web.items():
        if value:
            problem = _unusable(key, Path(value))
            if problem:
                raise section.fail(key, problem)
    section.done()

    settings: dict[str, CheckSettings] = {}
    for name, values in checks.items():
        table = _Reader(path, text, ("checks", name), {})
        if name not in known_checks:
            raise table.fail(
                None, f"no check named {name!r} (checks: {', '.join(sorted(known_checks))})"
            )
        if not isinstance(values, dict):
            raise _Reader(path, text, ("checks",), {}).fail(name, "expected a table")
        table = _Reader(path, text, ("checks", name), values)
        settings[name] = CheckSettings(
            enabled=table.take("enabled", bool, True),
            interval_s=table.positive("interval", None),
            timeout_s=table.positive("timeout", None),
        )
        table.done()

    bench = _Reader(path, text, ("benchmarks",), benchmarks)
    defaults = BenchmarkSettings()
    device = bench.take("device", str, defaults.device)
    if device not in ("cuda", "cpu"):
        raise bench.fail("device", f'expected "cuda" or "cpu", got {device!r}')
    idle_window = bench.take("idle_window", (int, float), defaults.idle_window_s)
    if idle_window < 0:
        raise bench.fail("idle_window", f"must be 0 or more, got {idle_window!r}")
    ratios = {}
    for key in ("warn_below", "fail_below", "memory_fraction"):
        value = bench.take(key, (int, float), getattr(defaults, key))
        if not 0 < value <= 1:
            raise bench.fail(key, f"must be a ratio in (0, 1], got {value!r}")
        ratios[key] = float(value)
    if ratios["fail_below"] > ratios["warn_below"]:
        raise bench.fail("fail_below", "must not be above warn_below")
    bench_settings = BenchmarkSettings(
        enabled=bench.take("enabled", bool, defaults.enabled),
        interval_s=bench.positive("interval", defaults.interval_s) or defaults.interval_s,
        duration_s=bench.positive("duration", defaults.duration_s) or defaults.duration_s,
        device=device,
        idle_window_s=float(idle_window),
        **ratios,
    )
    bench.done()
    return replace(
        config,
        listen=listen,
        textfile_dir=Path(textfile) if textfile else None,
        expected_gpus=expected,
        kernel_log=Path(kernel_log) if kernel_log else None,
        nvml_timeout_s=timeout or config.nvml_timeout_s,
        state_dir=Path(state_dir) if state_dir else None,
        snapshot=Path(snapshot) if snapshot else None,
        tls_cert_file=Path(web["tls_cert_file"]) if web["tls_cert_file"] else None,
        tls_key_file=Path(web["tls_key_file"]) if web["tls_key_file"] else None,
        basic_auth_file=Path(web["basic_auth_file"]) if web["basic_auth_file"] else None,
        checks=settings,
        benchmarks=bench_settings,
    )


def load_config(path: Path | None, known_checks: set[str]) -> AgentConfig:
    """The file's configuration; the embedded defaults when `path` is None, or when it is
    the default path and absent (a node set up without a file)."""
    if path is None:
        return AgentConfig()
    try:
        text = path.read_text()
    except FileNotFoundError:
        if path == DEFAULT_PATH:
            return AgentConfig()
        raise ConfigError(path, None, "", "no such file") from None
    except OSError as err:
        raise ConfigError(path, None, "", err.strerror or str(err)) from err
    return parse_config(text, path, known_checks)
