"""Side environments: third-party Python packages kept out of the project's venv.

Tests and benchmarks drive other people's code (TRL for the peer benchmark, SGLang's frontend for
the inference server's fidelity tests). Their pinned dependencies would fight ours, so each gets
its own venv under `STACX_HOME`, built on first use. Our torch / transformers site-packages is
appended to its path (a `.pth`, after its own site-packages), so pip installs only what the
package adds, never a second multi-GB torch, and never touches our venv. `no_deps` packages are
installed without their dependency lists (SGLang's runtime pins CUDA wheels its frontend never
imports); `requirements` are installed normally.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

from stacx.infra.paths import stacx_home

__all__ = ["SideVenvError", "ensure_side_venv"]


class SideVenvError(RuntimeError):
    """A side environment could not be built (pip's last lines say why)."""


def _shared_site_packages() -> str:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None, "torch is not installed in this venv"
    return str(Path(spec.origin).parents[1])


def ensure_side_venv(
    name: str, requirements: list[str], *, no_deps: list[str] | None = None, timeout_s: float = 900.0
) -> tuple[Path, float]:
    """`<STACX_HOME>/venv-<name>` with these packages; returns (its python, seconds spent building).

    Rebuilt when the requirement lists or our site-packages change (a marker file records them)."""
    venv = stacx_home() / f"venv-{name}"
    python = venv / "bin" / "python"
    shared = _shared_site_packages()
    wanted = "\n".join([shared, *sorted(requirements), "--no-deps", *sorted(no_deps or [])])
    marker = venv / ".stacx-ready"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python, 0.0
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=timeout_s)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "_stacx_shared_torch.pth").write_text(shared + "\n")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for extra, packages in (([], requirements), (["--no-deps"], no_deps or [])):
        if not packages:
            continue
        done = subprocess.run([*pip, *extra, *packages], capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise SideVenvError(
                f"installing {' '.join(packages)} into {venv} failed (is the package index reachable?):\n"
                f"{done.stderr[-2000:]}"
            )
    marker.write_text(wanted)
    return python, time.monotonic() - started
