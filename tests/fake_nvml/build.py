"""Compile the fake NVML library (fake_nvml.c) against the real nvml.h.

Usage: python -m tests.fake_nvml.build OUT_DIR
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIB_NAME = "libnvidia-ml.so.1"
CFLAGS = ["-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-pthread"]


def find_nvml_header() -> Path:
    """The nvml.h of the nvidia-nvml-dev wheel: nvidia/<folder>/include/nvml.h on sys.path.

    Prefers the newest cuNN folder (cu13 over cu12); other folder names come last.
    """
    found: list[tuple[int, str, Path]] = []
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if not base.is_dir():
            continue
        for header in base.glob("*/include/nvml.h"):
            folder = header.parent.parent.name
            match = re.fullmatch(r"cu(\d+)", folder)
            found.append((int(match.group(1)) if match else -1, folder, header))
    if not found:
        raise FileNotFoundError(
            "nvml.h not found under nvidia/*/include/ on sys.path; "
            "pip install nvidia-nvml-dev (it is in the project's `test` extra)"
        )
    return max(found, key=lambda item: (item[0], item[1]))[2]


def _command(header: Path, gcc: str, out: Path) -> list[str]:
    return [
        gcc,
        *CFLAGS,
        f"-Wl,-soname,{LIB_NAME}",
        f"-I{header.parent}",
        "-o",
        str(out),
        str(SOURCE),
    ]


def build_fake_nvml(out_dir: Path) -> Path:
    """Compile into out_dir/libnvidia-ml.so.1 (unless already built from this source)."""
    header = find_nvml_header()
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / LIB_NAME
    stamp_file = out_dir / f"{LIB_NAME}.stamp"
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(b"\0" + str(header).encode() + b"\0" + " ".join(CFLAGS).encode())
    stamp = digest.hexdigest()
    if lib.is_file() and stamp_file.is_file() and stamp_file.read_text().strip() == stamp:
        return lib
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FileNotFoundError("gcc not found on PATH: it compiles the fake NVML library")
    # Compile to a temporary name and rename, so a concurrent loader never sees half a file.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{LIB_NAME}.", dir=out_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        proc = subprocess.run(
            _command(header, gcc, tmp), capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} failed:\n{proc.stderr}")
        tmp.chmod(0o755)
        tmp.replace(lib)
    finally:
        tmp.unlink(missing_ok=True)
    stamp_file.write_text(stamp + "\n")
    return lib


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.fake_nvml.build OUT_DIR", file=sys.stderr)
        return 2
    print(build_fake_nvml(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
