"""`InferenceServer`: load a Hugging Face causal LM, start the batching engine, serve HTTP."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from stacx.rollout.inference.app import build_app
from stacx.rollout.inference.engine import BatchingEngine
from stacx.rollout.inference.errors import InferenceError, ServerUnavailableError
from stacx.rollout.inference.state import ServingState
from stacx.schemas.config import Port
from stacx.schemas.http_limits import HttpLimits, uvicorn_options

__all__ = ["InferenceServer", "load_model"]

log = logging.getLogger(__name__)

_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InferenceError(f"device={device!r} but torch sees no CUDA GPU; use device='cpu'")
    return device


def load_model(model_path: str | Path, device: str = "auto", dtype: str = "auto") -> tuple[Any, Any]:
    """(model, tokenizer) from a local HF directory; float32 on CPU unless `dtype` says else."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_path)
    if not (path / "config.json").is_file():
        raise InferenceError(
            f"{path} has no config.json: pass a local Hugging Face model "
            "directory (make one with `stacx models tiny --out DIR`)"
        )
    if dtype not in _DTYPES:
        raise InferenceError(f"dtype={dtype!r}; use one of {_DTYPES}")
    device = _pick_device(device)
    torch_dtype = (torch.float32 if device == "cpu" else "auto") if dtype == "auto" else getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    model = model.to(device).eval()  # type: ignore[arg-type]
    return model, tokenizer


GRACEFUL_SHUTDOWN_S = 5
"""After this many seconds, connections still open at shutdown are closed."""


class _EngineStoppingServer(uvicorn.Server):
    """uvicorn, stopping the engine first on SIGTERM/SIGINT: in-flight requests then end at once
    (503) instead of holding the graceful shutdown open."""

    def __init__(self, config: Any, engine: BatchingEngine) -> None:
        super().__init__(config)
        self._engine = engine

    async def shutdown(self, sockets: Any = None) -> None:
        await asyncio.to_thread(self._engine.stop)
        await super().shutdown(sockets)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class InferenceServer:
    """The built-in SGLang-compatible server (`stacx serve --engine builtin`)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        model_path: str
        """Local Hugging Face model directory (config.json, safetensors, tokenizer)."""
        host: str = "127.0.0.1"
        """Interface to listen on."""
        port: Port = 30000
        """TCP port (SGLang's default); 0 picks a free one."""
        device: str = "auto"
        """`auto` (CUDA when present, else CPU), `cpu` or `cuda[:N]`."""
        dtype: str = "auto"
        """`auto` (float32 on CPU, the checkpoint's dtype on GPU), float32, bfloat16, float16."""
        weight_version: str = "default"
        """Version reported before the first `/update_weights_from_disk` (SGLang's default)."""
        served_model_name: str | None = None
        """Name in OpenAI responses; defaults to the model directory name."""
        torch_threads: int | None = None
        """CPU threads for torch (process-wide); None keeps torch's default. On a busy machine
        1 is often fastest: idle-spinning thread pools stall when cores are oversubscribed."""
        context_length: int | None = None
        """Prompt + completion limit; defaults to the model's max_position_embeddings."""
        engine: BatchingEngine.Config = field(default_factory=BatchingEngine.Config)
        """Batching engine settings."""
        limits: HttpLimits = field(default_factory=HttpLimits)
        """Request body, header and read-time limits (413, 431, 408)."""
        wait_for_weights: bool = False
        """Answer `/health` 503 until `mark_weights_current()`: a server that follows a weight
        topic is ready once it serves the newest version, not while on its base weights."""

    def __init__(self, config: Config) -> None:
        self.config = config
        if config.torch_threads is not None:
            import torch

            torch.set_num_threads(config.torch_threads)
        model, tokenizer = load_model(config.model_path, config.device, config.dtype)
        self.engine = BatchingEngine(config.engine, model, tokenizer, config.weight_version)
        context = config.context_length or int(getattr(model.config, "max_position_embeddings", 4096))
        self.state = ServingState(
            engine=self.engine,
            tokenizer=tokenizer,
            model_path=str(config.model_path),
            served_model_name=config.served_model_name or Path(config.model_path).name,
            context_length=context,
            not_ready="loading the newest weight version" if config.wait_for_weights else None,
        )
        self.app = build_app(self.state, config.limits)
        self._uvicorn: Any = None
        self._thread: threading.Thread | None = None

    def mark_weights_current(self) -> None:
        """The newest weight version is loaded (or there is none): `/health` answers ready."""
        if self.state.not_ready is not None:
            log.info("ready: serving weight version %s", self.engine.weight_version)
        self.state.not_ready = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def _uvicorn_server(self) -> Any:
        if self.config.port == 0:
            self.config.port = _free_port(self.config.host)
        config = uvicorn.Config(
            self.app,
            host=self.config.host,
            port=self.config.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            **uvicorn_options(self.config.limits),
        )
        return _EngineStoppingServer(config, self.engine)

    def serve_forever(self) -> None:
        """Run until interrupted (the `stacx serve` entry point)."""
        self.engine.start()
        self._uvicorn = self._uvicorn_server()
        log.info("serving %s at %s", self.config.model_path, self.base_url)
        try:
            asyncio.run(self._uvicorn.serve())
        finally:
            self.engine.stop()

    def start(self, timeout_s: float = 30.0) -> str:
        """Serve from a background thread (tests, benchmarks); returns the base URL."""
        self.engine.start()
        self._uvicorn = self._uvicorn_server()
        self._thread = threading.Thread(target=self._uvicorn.run, name="stacx-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._uvicorn.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise ServerUnavailableError(f"server did not start on {self.base_url}")
            time.sleep(0.02)
        return self.base_url

    def stop(self) -> None:
        """Fail what is still running (503, retriable), then close the HTTP server."""
        self.engine.stop()
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=GRACEFUL_SHUTDOWN_S + 5)

    def __enter__(self) -> InferenceServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
