"""Compile a C source string into a shared library once per machine, and load it with ctypes.

The engine's CPU kernels (``cpu_attention.py``, ``cpu_fused.py``) are C source held in their
modules, built with the system compiler for this very CPU (``-march=native``) the first time
an engine needs them. The library is cached under ``$IZH_CACHE_DIR`` (else
``~/.cache/izh_trio``) by a digest of the source, the compiler and the flags, so a changed
kernel or a different compiler builds afresh and an unchanged one is never rebuilt; an flock
makes the engines of one machine compile once between them. With no compiler, or a source
that does not compile, ``build`` returns None and the caller keeps its torch path.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

#: -fopenmp-simd honours ``#pragma omp simd`` without linking an OpenMP runtime.
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-shared", "-fPIC")


def compiler() -> str | None:
    """``$CC`` (default ``cc``), else ``gcc``; None when neither is on the PATH."""
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def cache_dir() -> Path:
    return Path(os.environ.get("IZH_CACHE_DIR", Path.home() / ".cache" / "izh_trio"))


def build(name: str, source: str, extra_flags: Sequence[str] = (), label: str | None = None,
          directory: Path | None = None) -> ctypes.CDLL | None:
    """The library built from ``source`` (``extra_flags`` come after ``FLAGS``, so a later
    ``-march`` wins), compiling it first if no cached copy exists; None when it cannot be had.
    ``label`` names the kernel in log messages."""
    label = label or name
    cc = compiler()
    if cc is None:
        log.info("%s unavailable: no C compiler; using torch's", label)
        return None
    flags = [*FLAGS, *extra_flags]
    digest = hashlib.sha256("\0".join([source, cc, *flags]).encode()).hexdigest()[:16]
    directory = directory or cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"{name}-{digest}.so"
        with open(directory / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one compile per machine, however many engines
            if not target.exists():
                with tempfile.TemporaryDirectory(dir=directory) as tmp:
                    src, so = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
                    src.write_text(source)
                    done = subprocess.run([cc, *flags, str(src), "-o", str(so), "-lm"],
                                          capture_output=True, text=True)
                    if done.returncode != 0:
                        log.warning("%s did not compile; using torch's: %s", label,
                                    done.stderr[-500:])
                        return None
                    os.replace(so, target)
        return ctypes.CDLL(str(target))
    except OSError as exc:
        log.warning("%s unavailable: %s", label, exc)
        return None
