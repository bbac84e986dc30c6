"""Compile generated Avro reader source (schemas/_reader.py) to a C extension with Cython.

The generated source is plain Python with Cython type annotations on its integer locals
(`pos: cython.Py_ssize_t`): Python runs it as is (local annotations are never evaluated), and
Cython turns the varint arithmetic, bounds checks and loops into C. The same source, so one
code path to test. A module is built once per machine and cached under
`$STACX_READERS_DIR` (default ~/.cache/stacx/avro-readers), keyed by the source, the
Cython version and the Python ABI; `make setup` builds the readers of the built-in schemas.

Building needs Cython (PyPI `cython`), a C compiler and the Python headers; without them
`NativeBuildError` says which is missing.

    python -m schemas._native    # build (or check) the readers of the built-in schemas
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from schemas.errors import NativeBuildError

__all__ = ["cache_dir", "native_factory"]

log = logging.getLogger(__name__)

_DIRECTIVES = {"language_level": 3, "boundscheck": True, "wraparound": True, "infer_types": None}
"""Bounds-checked indexing: a truncated event raises IndexError (a corrupt body), as in Python."""
_loaded: dict[str, ModuleType] = {}


def cache_dir() -> Path:
    """`$STACX_READERS_DIR`, by default ~/.cache/stacx/avro-readers: one cache per machine, not
    under `$STACX_HOME`, which tests and services point at private folders (each would compile
    every reader again, ~10 s each). Safe to share: a module's key names its source, the Cython
    version and the Python ABI."""
    folder = os.environ.get("STACX_READERS_DIR")
    return Path(folder) if folder else Path.home() / ".cache" / "stacx" / "avro-readers"


def native_factory(source: str) -> Callable[[Mapping[str, Any]], Any]:
    """`_make` of `source` (schemas/_reader.py) compiled to C: built once per machine, then
    loaded from the cache. Raises NativeBuildError when it cannot be built."""
    make: Callable[[Mapping[str, Any]], Any] = _module(f"import cython\n\n\n{source}").__dict__["_make"]
    return make


def _module(text: str) -> ModuleType:
    name = f"_stacx_avro_{_key(text)}"
    if name in _loaded:
        return _loaded[name]
    folder = cache_dir()
    path = folder / f"{name}{_suffix()}"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder / ".lock"):
            if not path.exists():
                _build(name, text, path)
    _loaded[name] = _import(name, path)
    return _loaded[name]


def _key(text: str) -> str:
    """Source, Cython version and Python ABI: a change of any builds a fresh module."""
    try:
        from Cython import __version__ as cython_version
    except ImportError:  # a module built earlier still loads; a new one reports the import
        cython_version = "none"
    tag = f"{cython_version}|{sys.implementation.cache_tag}|{_suffix()}|{text}"
    return hashlib.sha256(tag.encode()).hexdigest()[:20]


def _suffix() -> str:
    return str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One build at a time on this machine (processes of a test run, services starting)."""
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(name: str, text: str, target: Path) -> None:
    _check_toolchain()
    log.info("compiling an Avro reader with Cython (once per machine): %s", target.name)
    with tempfile.TemporaryDirectory(prefix="build-", dir=target.parent) as tmp:
        pyx = Path(tmp) / f"{name}.pyx"
        pyx.write_text(text, encoding="utf-8")
        built = _run_build(name, pyx, Path(tmp))
        os.replace(built, target)  # atomic: a reader never loads half a file


def _run_build(name: str, pyx: Path, tmp: Path) -> Path:
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    ext = Extension(name, [str(pyx)], extra_compile_args=["-O2", "-g0"])  # no debug info: 1/7 the size
    try:
        modules = cythonize([ext], quiet=True, compiler_directives=_DIRECTIVES)
        command = build_ext(Distribution({"ext_modules": modules}))
        command.build_lib, command.build_temp = str(tmp), str(tmp / "obj")
        command.ensure_finalized()
        with contextlib.redirect_stdout(sys.stderr):
            command.run()
    except Exception as exc:  # Cython CompileError, setuptools CompileError/LinkError...
        raise NativeBuildError(f"compiling an Avro reader failed ({type(exc).__name__}: {exc})") from exc
    return Path(command.get_ext_fullpath(name))


def _check_toolchain() -> None:
    """A clear one-line error for each missing piece, before a build fails obscurely."""
    if importlib.util.find_spec("Cython") is None:
        raise NativeBuildError("Cython is not installed: pip install 'cython>=3.0' (make setup does)")
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]  # as setuptools
    if shutil.which(compiler) is None:
        raise NativeBuildError(
            f"no C compiler ({compiler!r} not on PATH): install one (Debian: apt-get install gcc)"
        )
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        raise NativeBuildError(
            f"no Python headers ({headers} missing): install them (Debian: apt-get install python3-dev)"
        )


def _import(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:  # pragma: no cover - only for a path without an extension suffix
        raise NativeBuildError(f"cannot load the compiled reader {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main() -> int:
    """Build the readers of every built-in schema; one line on success or failure."""
    from schemas._reader import compile_reader
    from schemas.codec import BUILTIN_CLASSES, builtin_schemas

    try:
        for info in builtin_schemas():
            compile_reader(info.schema, BUILTIN_CLASSES, native=True)
    except NativeBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"compiled Avro readers ready in {cache_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
