"""NvmlSession against the fake driver, in subprocesses (each starts with NVML's
reference count at zero, so what these tests count is theirs alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.nvml_scenarios import dgx_healthy, modified, write_scenario

PROLOGUE = """
import json, sys, threading, time
import pynvml
from nodecheck.checks.node.nvml import NvmlHungError, NvmlSession
session = NvmlSession(library_path=sys.argv[1], deadline_s=float(sys.argv[2]))
out = {}
def initialised():
    try:
        pynvml.nvmlDeviceGetCount()
        return True
    except pynvml.NVMLError_Uninitialized:
        return False
"""


def run(library: Path, scenario: Path, deadline_s: float, body: str) -> dict[str, object]:
    env = {**os.environ, "FAKE_NVML_SCENARIO": str(scenario)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PROLOGUE + body + "\nprint(json.dumps(out))",
            str(library),
            str(deadline_s),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_concurrent_callers_initialise_once(fake_nvml_library: Path, tmp_path: Path) -> None:
    scenario = write_scenario(dgx_healthy(), tmp_path / "s.json")
    out = run(
        fake_nvml_library,
        scenario,
        5.0,
        """
threads = [threading.Thread(target=session.module) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
out["before_close"] = initialised()
session.close()
out["after_close"] = initialised()
""",
    )
    assert out == {"before_close": True, "after_close": False}


def test_an_init_past_its_deadline_still_counts_once(
    fake_nvml_library: Path, tmp_path: Path
) -> None:
    """nvmlInit answering after the deadline: the caller got NvmlHungError, the session
    is wedged until the init returns, then usable, and one close() shuts NVML down."""
    scenario = write_scenario(modified(dgx_healthy(), init_hang_s=0.6), tmp_path / "s.json")
    out = run(
        fake_nvml_library,
        scenario,
        0.2,
        """
try:
    session.module()
except NvmlHungError as err:
    out["first"] = str(err)
out["wedged"] = session.wedged
time.sleep(0.8)
out["later"] = session.wedged
session.module()
session.close()
out["after_close"] = initialised()
""",
    )
    assert out == {
        "first": "NVML did not answer in 0.2 s (nvmlInit)",
        "wedged": True,
        "later": False,
        "after_close": False,
    }


def test_pynvml_is_imported_without_ctypes_util() -> None:
    """import_pynvml leaves out ctypes.util (and the subprocess, shutil and tempfile it
    imports); pynvml's find_library still works, and a later `import ctypes.util` gets
    the real module."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            """
import json, sys
from nodecheck.checks.node.nvml import import_pynvml
pynvml = import_pynvml()
out = {"imported": sorted(m for m in ("ctypes.util", "subprocess", "shutil", "tempfile")
                          if m in sys.modules)}
out["again_is_same"] = import_pynvml() is pynvml
import ctypes.util
out["real_after"] = getattr(ctypes.util, "__file__", None) is not None
out["found_libc"] = pynvml.find_library("c") == ctypes.util.find_library("c")
print(json.dumps(out))
""",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "imported": [],
        "again_is_same": True,
        "real_after": True,
        "found_libc": True,
    }


def test_pynvml_comes_as_usual_where_ctypes_util_is_already_imported() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ctypes.util, sys\n"
            "from nodecheck.checks.node.nvml import import_pynvml\n"
            "pynvml = import_pynvml()\n"
            "print(pynvml.find_library is ctypes.util.find_library)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
