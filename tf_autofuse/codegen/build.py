"""Compile-and-cache for generated code: the twin builds (g++) and the CANN builds.

Every build lands in `<cache>/<kind>/<key>/` where key hashes the sources, the command and the
compiler; a finished build holds `DONE`. Builds are serialised per key by a file lock; the
command lines and their output are kept next to the result (`build.log`), which the debug dump
copies.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from .._build import cache_dir

TWIN_DIR = Path(__file__).resolve().parent / "twin"
HOST_DIR = Path(__file__).resolve().parent / "host"


class CodegenBuildError(RuntimeError):
    """A generated kernel did not build; the message holds the command and the compiler output."""


def cxx() -> str:
    return os.environ.get("CXX") or shutil.which("g++") or "g++"


def key_of(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def support_digest() -> str:
    """Hash of the twin and host support files every build includes."""
    files = sorted(TWIN_DIR.rglob("*.h")) + sorted(TWIN_DIR.rglob("*.cpp")) + sorted(HOST_DIR.rglob("*.h"))
    return key_of(*(p.name.encode() + p.read_bytes() for p in files))


def cached_build(kind: str, key: str, files: dict, commands: list, product: str) -> Path:
    """Write `files` into the build dir, run `commands` (lists; '{dir}' expands), return the product.

    Raises CodegenBuildError with the failing command and its output."""
    root = cache_dir() / kind / key
    target = root / product
    if (root / "DONE").exists() and target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "DONE").exists() and target.exists():
            return target
        for name, text in files.items():
            (root / name).write_text(text)
        log = []
        for command in commands:
            command = [c.replace("{dir}", str(root)) for c in command]
            log.append("$ " + " ".join(command))
            try:
                proc = subprocess.run(command, cwd=root, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, timeout=900)
            except (OSError, subprocess.TimeoutExpired) as err:
                log.append(str(err))
                (root / "build.log").write_text("\n".join(log) + "\n")
                raise CodegenBuildError(f"{' '.join(command)}: {err}") from None
            log.append(proc.stdout)
            if proc.returncode != 0:
                (root / "build.log").write_text("\n".join(log) + "\n")
                raise CodegenBuildError(
                    f"build failed (exit {proc.returncode}):\n$ {' '.join(command)}\n{proc.stdout[-6000:]}")
        (root / "build.log").write_text("\n".join(log) + "\n")
        (root / "DONE").write_text("ok\n")
    return target
