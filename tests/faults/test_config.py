"""Fault matrix, configuration: every way a configuration file, a value in it, or a file
it names can be bad is a ConfigError naming the file (line and key where there are
some), and `nodecheck config check` exits 2 saying so: never a traceback, never
"internal error", never a hang, never a value the agent then misuses (NaN, infinity)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from nodecheck.agent.config import ConfigError, load_config
from nodecheck.checks.registry import load_checks
from tests.agent.test_cli import run
from tests.agent.test_daemon import wait_for

CHECKS = set(load_checks())
MIB = 1 << 20

# Every numeric key, where it goes, and the range its error names.
NUMERIC_KEYS = [
    ("agent", "nvml_timeout", "from 0.1 to 8 seconds"),
    ("agent", "expected_gpus", "from 0 to 1024"),
    ("checks.cpu", "interval", "from 1 to 2592000 seconds (30 days)"),
    ("checks.cpu", "timeout", "above 0 and at most 3600 seconds"),
    ("benchmarks", "interval", "from 1 to 2592000 seconds (30 days)"),
    ("benchmarks", "duration", "from 0.1 to 600 seconds"),
    ("benchmarks", "idle_window", "from 0 to 3600 seconds"),
    ("benchmarks", "warn_below", "above 0 and at most 1"),
    ("benchmarks", "fail_below", "above 0 and at most 1"),
    ("benchmarks", "memory_fraction", "from 0.01 to 0.95"),
    ("benchmarks", "network_max_age", "from 3600 to 2592000 seconds (30 days)"),
]
# TOML literals that are numbers outside every range (TOML has nan and inf).
OUT_OF_RANGE = ["nan", "+nan", "inf", "-inf", "-1", "99999999999999999999", "1e300"]


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def refused(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, CHECKS)
    return str(caught.value)


@pytest.mark.parametrize("literal", OUT_OF_RANGE)
@pytest.mark.parametrize(("table", "key", "allowed"), NUMERIC_KEYS)
def test_a_number_out_of_range_names_file_line_key_and_range(
    tmp_path: Path, table: str, key: str, allowed: str, literal: str
) -> None:
    """NaN, infinities, negatives, 20-digit integers: refused with the allowed range."""
    path = write(tmp_path / "c.toml", f"[{table}]\n{key} = {literal}\n")
    message = refused(path)
    assert message.startswith(f"{path}:2: {table}.{key}: "), message
    if key == "expected_gpus" and literal not in ("-1", "99999999999999999999"):
        assert "expected an integer, got a number" in message, message
    else:
        assert f"must be {allowed}" in message or f"finite number {allowed}" in message, message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # Refused before tomllib, which recurses on brackets and takes time quadratic in a
        # dotted key's depth (20,000 levels: half a minute).
        ("a = " + "[" * 5000 + "]" * 5000 + "\n", ":1: nested too deeply: arrays"),
        ("a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n", ":1: nested too deeply: arrays"),
        ("[checks.cpu]\nenabled" + ".y" * 20000 + " = 1\n", ":2: nested too deeply: a key"),
        ("[" + ".".join(["t"] * 40) + "]\n", ":1: nested too deeply: a key"),
        ('[agent]\nlisten = "' + "x" * 500_000 + ':1"\n', "agent.listen: not a host name"),
        ("a = " + "9" * 5000 + "\n", "not usable TOML: Exceeds the limit"),
        ("[agent]\nkernel_log = 'var/log/kern.log'\n", "agent.kernel_log: must be an absolute"),
        ('[agent]\nstate_dir = "/tmp/a\\u0000b"\n', "agent.state_dir: contains a NUL"),
        ('[agent]\nlisten = "[::1:80"\n', "agent.listen: expected host:port"),
        ('[agent]\nlisten = "[zz]:80"\n', "agent.listen: not an IPv6 address"),
        ('[agent]\nlisten = "300.1.1.1:80"\n', "agent.listen: not an IPv4 address"),
        ('[agent]\nlisten = ":\\u0661\\u0662"\n', "agent.listen: expected host:port"),
        ('[agent]\nlisten = ":0"\n', "agent.listen: port 0 out of range"),
        ('[benchmarks]\ndevice = ["cuda"]\n', "benchmarks.device: expected a string"),
        ("[checks]\ncpu = 5\n", "checks.cpu: expected a table, got an integer 5"),
        ("checks = 5\n", "checks: expected a table"),
    ],
)
def test_unusable_values_and_documents(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "c.toml", text)
    got = refused(path)
    assert got.startswith(str(path)) and message in got, got[:300]
    assert len(got) < 600  # the value is shown cut short, not whole


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def loop(path: Path) -> Path:
    path.symlink_to(path.name)  # a link to itself: ELOOP
    return path


BAD_CONFIG_FILES: list[tuple[str, Callable[[Path], Path], str]] = [
    (
        "not UTF-8",
        lambda p: write(p, b'[agent]\nlisten = ":1\xff"\n'),
        ":2: not UTF-8 text (byte 0xff)",
    ),
    ("a binary", lambda p: Path("/bin/ls"), ":1: not UTF-8 text"),
    ("over 1 MiB", lambda p: write(p, "#" * (2 * MIB) + "\n"), "larger than 1 MiB"),
    ("a FIFO", fifo, "a FIFO, not a regular file"),
    ("/dev/zero", lambda p: Path("/dev/zero"), "a character device, not a regular file"),
    ("a symlink loop", loop, "Too many levels of symbolic links"),
    ("missing", lambda p: p, "no such file"),
]


@pytest.mark.parametrize(
    ("what", "make", "message"), BAD_CONFIG_FILES, ids=[row[0] for row in BAD_CONFIG_FILES]
)
def test_config_check_refuses_a_bad_file_with_exit_2(
    tmp_path: Path, what: str, make: Callable[[Path], Path], message: str
) -> None:
    """Exit 2 naming the file and why (today: exit 3 "internal error" for the first two, a
    hang for the FIFO, a 2 MiB file read whole)."""
    path = make(tmp_path / "c.toml")
    for args in (["config", "check", str(path)], ["config", "show", "--config", str(path)]):
        done = run(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith(f"nodecheck: bad configuration: {path}"), done.stderr
        assert message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def certificate(directory: Path, name: str, *, pass_phrase: str | None = None) -> tuple[Path, Path]:
    """A self-signed EC certificate and its key (encrypted when pass_phrase is given)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    secret = ["-passout", f"pass:{pass_phrase}"] if pass_phrase else ["-nodes"]
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        *secret, "-days", "1", "-subj", f"/CN={name}",
        "-addext", "subjectAltName=IP:127.0.0.1",
        "-keyout", str(key), "-out", str(cert),
    )  # fmt: skip
    return cert, key


def named_file_cases(tmp: Path) -> list[tuple[str, str, str]]:
    """(id, the [agent] lines, what the error says) for files the configuration names."""
    big = write(tmp / "big-users", "#" * (2 * MIB) + "\n")
    latin1 = write(tmp / "latin1-users", b"# \xe9quipe\nprometheus:$2b$04$abc\n")
    users_fifo = fifo(tmp / "users-fifo")
    plain = write(tmp / "plain", "not a directory\n")
    kernel_fifo = fifo(tmp / "kern-fifo")
    return [
        ("users not UTF-8", f'basic_auth_file = "{latin1}"', f"{latin1}:1: not UTF-8"),
        ("users over 1 MiB", f'basic_auth_file = "{big}"', f"{big}: larger than 1 MiB"),
        ("users a FIFO", f'basic_auth_file = "{users_fifo}"', f"{users_fifo}: a FIFO"),
        ("users a directory", f'basic_auth_file = "{tmp}"', f"{tmp}: a directory"),
        ("users /dev/zero", 'basic_auth_file = "/dev/zero"', "/dev/zero: a character device"),
        ("textfile_dir missing", f'textfile_dir = "{tmp}/none"', f"{tmp}/none: no such directory"),
        ("textfile_dir a file", f'textfile_dir = "{plain}"', f"{plain}: a regular file, not a dir"),
        ("state_dir a file", f'state_dir = "{plain}"', f"{plain}: a regular file, not a directory"),
        ("state_dir missing", f'state_dir = "{tmp}/none"', f"{tmp}/none: no such directory"),
        ("kernel_log missing", f'kernel_log = "{tmp}/kern.log"', f"{tmp}/kern.log: no such file"),
        ("kernel_log a directory", f'kernel_log = "{tmp}"', f"{tmp}: a directory, not a log"),
        ("kernel_log a FIFO", f'kernel_log = "{kernel_fifo}"', f"{kernel_fifo}: a FIFO"),
        ("snapshot a directory", f'snapshot = "{tmp}"', f"{tmp}: a directory, not a snapshot"),
        ("snapshot a FIFO", f'snapshot = "{kernel_fifo}"', f"{kernel_fifo}: a FIFO, not a snap"),
        ("cert a FIFO", f'tls_cert_file = "{kernel_fifo}"\ntls_key_file = "{plain}"', "a FIFO"),
    ]


def test_files_the_configuration_names(tmp_path: Path) -> None:
    """Each named file is checked as the agent will use it; each bad one is named."""
    for what, lines, message in named_file_cases(tmp_path):
        path = write(tmp_path / "c.toml", f"[agent]\n{lines}\n")
        got = refused(path)
        assert got.startswith(f"{path}:2: agent."), (what, got)
        assert message in got, (what, got)


@pytest.mark.parametrize("problem", ["a key of another certificate", "an encrypted key"])
def test_config_check_refuses_tls_files_the_server_cannot_use(tmp_path: Path, problem: str) -> None:
    """Today both pass `config check`, and the agent then fails to start (or prompts for a
    pass phrase on the terminal). Needs exporter.tls_context (the web branch)."""
    cert, key = certificate(tmp_path, "a")
    if problem == "an encrypted key":
        cert, key = certificate(tmp_path, "locked", pass_phrase="s3cret")
    else:
        key = certificate(tmp_path, "b")[1]
    path = write(
        tmp_path / "c.toml", f'[agent]\ntls_cert_file = "{cert}"\ntls_key_file = "{key}"\n'
    )
    done = subprocess.run(
        [*run_argv(), "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,  # a pass-phrase prompt would wait here for ever
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"{path}:" in done.stderr and "agent.tls_" in done.stderr, done.stderr
    assert str(key) in done.stderr or str(cert) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def run_argv() -> list[str]:
    from tests.agent.test_cli import NODECHECK

    return list(NODECHECK)


def test_show_quotes_what_it_prints(tmp_path: Path) -> None:
    """A path with a quote in it is shown as TOML that reads back to the same value."""
    odd = tmp_path / 'state "dir"'
    odd.mkdir()  # a state directory it is given must exist
    path = write(tmp_path / "c.toml", f"[agent]\nstate_dir = '{odd}'\n")
    config = load_config(path, CHECKS)
    again = write(tmp_path / "again.toml", config.show())
    assert load_config(again, CHECKS).state_dir == odd


def config_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*run_argv(), "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero", "/dev/urandom"])
def test_kernel_log_refuses_character_devices_other_than_kmsg(tmp_path: Path, device: str) -> None:
    """kernel_log = "/dev/null": exit 2 naming the device and its numbers; xid.py refuses
    it at run time, so config check must too. (Before: accepted, exit 0.) /dev/kmsg and
    a log file pass."""
    path = write(tmp_path / "c.toml", f'[agent]\nkernel_log = "{device}"\n')
    done = config_check(path)
    assert done.returncode == 2, done.stderr
    assert f"{path}:2: agent.kernel_log: {device}: a character device 1:" in done.stderr
    assert "not the kmsg device" in done.stderr, done.stderr
    log = write(tmp_path / "kern.log", "")
    for good in ("/dev/kmsg", str(log)):
        if os.access(good, os.R_OK):
            write(path, f'[agent]\nkernel_log = "{good}"\n')
            assert config_check(path).returncode == 0, good


BAG_ATTRIBUTES = "Bag Attributes\n    friendlyName: café\n    localKeyID: 01 02\n"


def test_a_certificate_with_utf8_bag_attributes_passes_config_check(tmp_path: Path) -> None:
    """openssl pkcs12 -nokeys writes "Bag Attributes: friendlyName: café" (UTF-8) before
    the certificate: text outside BEGIN/END, which the server ignores; config check exits
    0. (Before: exit 3, "internal error: TypeError ...".)"""
    cert, key = certificate(tmp_path, "bag")
    cert.write_text(BAG_ATTRIBUTES + cert.read_text(), encoding="utf-8")
    path = write(
        tmp_path / "c.toml", f'[agent]\ntls_cert_file = "{cert}"\ntls_key_file = "{key}"\n'
    )
    done = config_check(path)
    assert done.returncode == 0, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


def test_a_certificate_with_non_ascii_inside_its_block_is_exit_2_naming_it(tmp_path: Path) -> None:
    """A byte outside ASCII inside BEGIN/END CERTIFICATE (not base64): exit 2 naming the
    file and the key. (Before: exit 3, "internal error: TypeError ...".)"""
    cert, key = certificate(tmp_path, "broken")
    lines = cert.read_text().splitlines(keepends=True)
    lines.insert(2, "é\n")
    cert.write_text("".join(lines), encoding="utf-8")
    path = write(
        tmp_path / "c.toml", f'[agent]\ntls_cert_file = "{cert}"\ntls_key_file = "{key}"\n'
    )
    done = config_check(path)
    assert done.returncode == 2, done.stderr
    assert f"{path}:2: agent.tls_cert_file: {cert}: certificate 1 of the file" in done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


def test_config_check_refuses_a_bcrypt_cost_above_17(tmp_path: Path) -> None:
    """A users line at cost 20 would make the agent's start-up take minutes (past the
    unit's TimeoutStartSec): exit 2 naming file, line and user. (Before: exit 0.)"""
    users = write(tmp_path / "users", "# scrapers\nslow:$2b$20$" + "a" * 53 + "\n")
    path = write(tmp_path / "c.toml", f'[agent]\nbasic_auth_file = "{users}"\n')
    done = config_check(path)
    assert done.returncode == 2, done.stderr
    assert f"{users}:2: slow: bcrypt cost 20 is above 17" in done.stderr, done.stderr


class BlockedWriter:
    """A thread blocked in open(2) of a FIFO for writing: fifo(7) wakes it when anyone
    opens the FIFO for reading, which is how the test sees an open that must not be."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.opened = threading.Event()
        self._thread_id: list[int] = []
        self.thread = threading.Thread(target=self._open, daemon=True)
        self.thread.start()
        wait_for(self._blocked, 30, f"a writer blocked in open({path})")

    def _blocked(self) -> bool:
        """The thread sleeps in the kernel's wait_for_partner (fs/pipe.c, fifo_open)."""
        if not self._thread_id:
            return False
        task = Path(f"/proc/self/task/{self._thread_id[0]}")
        try:
            return (task / "wchan").read_text().strip() == "wait_for_partner"
        except OSError:
            return False

    def _open(self) -> None:
        self._thread_id.append(threading.get_native_id())
        try:
            descriptor = os.open(self.path, os.O_WRONLY)
        except OSError:
            return
        self.opened.set()
        os.close(descriptor)

    def release(self) -> None:
        """Open it for reading ourselves, so the thread ends."""
        with contextlib.suppress(OSError):
            os.close(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))
        self.thread.join(10)


@pytest.mark.parametrize("key", ["config", "basic_auth_file", "tls_cert_file", "tls_key_file"])
def test_a_fifo_in_place_of_a_file_is_refused_without_being_opened(
    tmp_path: Path, key: str
) -> None:
    """A FIFO as the configuration file or a file it names: exit 2 naming it, and it is
    never opened (stat first: opening a device node has side effects, /dev/watchdog arms
    the watchdog; here, a writer blocked on the FIFO would be woken). (Before: opened
    non-blocking, then refused.)"""
    fifo_path = tmp_path / "fifo"
    writer = BlockedWriter(fifo_path)
    try:
        cert, tls_key = certificate(tmp_path, "c")
        files = {"tls_cert_file": cert, "tls_key_file": tls_key}
        if key == "config":
            path = fifo_path
        else:
            if key in files:
                files[key] = fifo_path
                lines = "".join(f'{name} = "{value}"\n' for name, value in files.items())
            else:
                lines = f'{key} = "{fifo_path}"\n'
            path = write(tmp_path / "c.toml", f"[agent]\n{lines}")
        done = config_check(path)
        assert done.returncode == 2, done.stderr
        assert f"{fifo_path}: a FIFO" in done.stderr or "a FIFO" in done.stderr, done.stderr
        # The open would have woken the writer before config check exited.
        assert not writer.opened.wait(2), f"{fifo_path} was opened"
    finally:
        writer.release()
