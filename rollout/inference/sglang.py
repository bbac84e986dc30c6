"""Launch SGLang (`python -m sglang.launch_server`) with flags matching the built-in server.

SGLang needs its package and a CUDA GPU; `unavailable_reason()` says which is missing. The
server is ready once `/health_generate` answers 200 (SGLang runs one real generation for it);
its GPUs are the ones `CUDA_VISIBLE_DEVICES` shows it (`stacx run` sets it per server from the
`resources:` section). `--enable-metrics` puts its Prometheus figures on `/metrics`.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass, field

from stacx.rollout.inference.child_server import stop_group, wait_healthy
from stacx.rollout.inference.errors import InferenceError

__all__ = ["SGLangServer", "unavailable_reason"]


def unavailable_reason() -> str | None:
    """Why SGLang cannot run here, or None when it can."""
    if importlib.util.find_spec("sglang") is None:
        return (
            "the sglang package is not installed in this environment (it needs a CUDA "
            f"machine); {_BUILTIN}, or install sglang on a GPU host"
        )
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA GPU is visible to torch; SGLang serves on GPUs only: {_BUILTIN}"
    return None


_BUILTIN = ("use the built-in server (`stacx serve --engine builtin`; in a pipeline file "
            "`inference.engine: builtin`)")


class SGLangServer:
    """One `sglang.launch_server` child process."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        model_path: str
        """Local Hugging Face model directory."""
        host: str = "127.0.0.1"
        """Interface to listen on."""
        port: int = 30000
        """TCP port."""
        dtype: str = "auto"
        """--dtype (auto, float16, bfloat16, float32)."""
        tp_size: int = 1
        """Tensor-parallel GPUs."""
        context_length: int | None = None
        """--context-length; None keeps the model's."""
        mem_fraction_static: float | None = None
        """--mem-fraction-static: share of GPU memory for weights and KV cache."""
        served_model_name: str | None = None
        """--served-model-name."""
        weight_version: str = "default"
        """--weight-version reported before the first update."""
        extra_args: list[str] = field(default_factory=list)
        """More launch_server flags, passed through verbatim."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def command(self) -> list[str]:
        c = self.config
        cmd = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            c.model_path,
            "--host",
            c.host,
            "--port",
            str(c.port),
            "--dtype",
            c.dtype,
            "--tp-size",
            str(c.tp_size),
            "--weight-version",
            c.weight_version,
        ]
        if c.context_length is not None:
            cmd += ["--context-length", str(c.context_length)]
        if c.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(c.mem_fraction_static)]
        if c.served_model_name:
            cmd += ["--served-model-name", c.served_model_name]
        return [*cmd, "--enable-metrics", *c.extra_args]

    def start(self) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise InferenceError(f"cannot launch SGLang: {reason}")
        self.process = subprocess.Popen(self.command(), start_new_session=True)

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        """Block until `/health_generate` answers 200; raises if the process dies or time runs out."""
        wait_healthy(self.process, f"{self.base_url}/health_generate", engine="SGLang",
                     timeout_s=timeout_s, poll_s=1.0, request_timeout_s=30)

    def wait(self) -> int:
        assert self.process is not None, "start() first"
        return self.process.wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to SGLang's whole process group (scheduler, detokenizer), then SIGKILL."""
        stop_group(self.process, timeout_s)
