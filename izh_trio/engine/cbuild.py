"""Build the engine's C kernels into shared libraries once per machine; load them with ctypes.

The engine's CPU kernels (``cpu_attention.py``, ``cpu_fused.py``, ``cpu_argmax.py``) are C
sources in ``csrc/``, shipped as package data, built with the system compiler for this very
CPU (``-march=native``) the first time an engine needs them: each module describes its kernel
as a ``Kernel`` and calls ``Kernel.load`` on its first ``available()``. The library is cached
under ``$IZH_CACHE_DIR`` (else ``~/.cache/izh_trio``) by a digest of the source, the compiler
and the flags, so a changed kernel or a different compiler builds afresh and an unchanged one
is never rebuilt; an flock makes the engines of one machine compile once between them. With
the kernel switched off, no compiler, a source missing or one that does not compile, there is
no library and the caller keeps its torch path.
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
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import attrs

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
                    # absolute: a source may include itself (__FILE__)
                    done = subprocess.run([cc, *flags, str(src.resolve()), "-o", str(so), "-lm"],
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


#: ctypes signatures of a library's functions: name -> (restype, argtypes).
Signatures = Mapping[str, tuple[Any, Sequence[Any]]]


@attrs.define
class Kernel:
    """One C kernel of ``csrc/``: the one loader of all of them, so that each module only
    says what its library is called, what switches it off and what its functions take. It is
    built (or found in the cache) on the first ``available()``, once."""

    name: str  # csrc/{name}.c, and the cached library's file name
    label: str  # names the kernel in log messages
    switch: str  # the environment variable that, set to "0", keeps torch's path
    signatures: Signatures
    extra_flags: tuple[str, ...] = ()  # after FLAGS
    #: None: not tried yet; False: unavailable (switched off, or no compiler)
    _lib: ctypes.CDLL | Literal[False] | None = attrs.field(default=None, init=False)

    def available(self) -> bool:
        """Whether the library is there, loading (and building) it on the first ask."""
        if self._lib is None:
            self._lib = self.load()
        return self._lib is not False

    @property
    def lib(self) -> ctypes.CDLL:
        """The loaded library; only after ``available()`` said True."""
        lib = self._lib
        assert lib, f"{self.label} is not loaded"
        return lib

    def address(self, function: str) -> int:
        """Where ``function`` of the loaded library starts, for C code that calls it itself."""
        return ctypes.cast(getattr(self.lib, function), ctypes.c_void_p).value or 0

    def source(self) -> str:
        """The C source, read from the package (a wheel ships ``csrc/`` as package data)."""
        return (resources.files("izh_trio.engine") / "csrc" / f"{self.name}.c").read_text("utf-8")

    def load(self) -> ctypes.CDLL | Literal[False]:
        """The library with its functions' signatures set, built first if no cached copy
        exists; False when it is switched off or cannot be had (the caller uses torch's)."""
        if os.environ.get(self.switch, "1") == "0":
            return False
        try:
            source = self.source()
        except OSError as exc:  # a broken install: serve on torch's path rather than fail
            log.warning("%s unavailable: no source (%s); using torch's", self.label, exc)
            return False
        lib = build(self.name, source, self.extra_flags, label=self.label)
        if lib is None:
            return False
        for function, (restype, argtypes) in self.signatures.items():
            if not hasattr(lib, function):  # an optional entry this compiler left out
                continue
            getattr(lib, function).restype = restype
            getattr(lib, function).argtypes = list(argtypes)
        return lib

    def has(self, function: str) -> bool:
        """Whether the loaded library has ``function`` (some entries depend on what the
        compiler supports, fp16's on a ``_Float16`` type); only after ``available()``."""
        return hasattr(self.lib, function)
