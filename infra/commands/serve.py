"""`stacx serve [--engine builtin|sglang] --model DIR` and `stacx models tiny --out DIR`."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.heap import freeze_startup_heap

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser("serve", help="serve a local HF causal LM (SGLang HTTP API)")
    serve.add_argument("--model", required=True, help="local Hugging Face model directory")
    serve.add_argument(
        "--engine",
        choices=("builtin", "sglang"),
        default="builtin",
        help="builtin: CPU/CUDA server in this process; sglang: launch SGLang",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=30000)
    serve.add_argument("--device", default="auto", help="builtin: auto, cpu or cuda[:N]")
    serve.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    serve.add_argument("--weight-version", default="default", help="version before any update")
    serve.add_argument("--served-model-name", help="name in OpenAI responses")
    serve.add_argument("--context-length", type=int, help="prompt + completion token limit")
    serve.add_argument("--max-batch-size", type=int, default=64, help="builtin: rows per step")
    serve.add_argument("--threads", type=int, help="builtin: torch CPU threads")
    serve.add_argument("--tp-size", type=int, default=1, help="sglang: tensor-parallel GPUs")
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
    from rollout.models import ModelFactoryError, make_tiny_model

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


def _start_follower(
    args: argparse.Namespace, base_url: str, on_caught_up: Callable[[], None] | None = None
) -> threading.Event | None:
    """Follow the weight topic from a thread; `on_caught_up` runs once the newest version is
    loaded (or catching up failed, which is logged: the server then serves what it has)."""
    if not args.follow_weights:
        return None
    from consumers.weights import WeightSubscriber, WeightUpdateError

    kwargs = {"bootstrap_servers": args.bootstrap_servers} if args.bootstrap_servers else {}
    if args.weights_topic:
        kwargs["topic"] = args.weights_topic
    subscriber = WeightSubscriber(
        WeightSubscriber.Config(model_name=args.follow_weights, server_url=base_url, **kwargs)
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
        subscriber.run(stop)

    threading.Thread(target=follow, name="stacx-weights", daemon=True).start()
    return stop


def _serve(args: argparse.Namespace) -> int:
    if not Path(args.model, "config.json").is_file():
        print(
            f"stacx serve: {args.model} has no config.json; pass a local Hugging Face model "
            "directory (`stacx models tiny --out DIR` makes one)",
            file=sys.stderr,
        )
        return 2
    return _serve_sglang(args) if args.engine == "sglang" else _serve_builtin(args)


def _serve_builtin(args: argparse.Namespace) -> int:
    from rollout.inference import BatchingEngine, InferenceError, InferenceServer

    config = InferenceServer.Config(
        model_path=args.model,
        host=args.host,
        port=args.port,
        device=args.device,
        dtype=args.dtype,
        weight_version=args.weight_version,
        served_model_name=args.served_model_name,
        context_length=args.context_length,
        torch_threads=args.threads,
        engine=BatchingEngine.Config(max_batch_size=args.max_batch_size),
        wait_for_weights=bool(args.follow_weights),
    )
    try:
        server = InferenceServer(config)
    except InferenceError as exc:
        print(f"stacx serve: {exc}", file=sys.stderr)
        return 2
    # The follower starts before the HTTP server is up; its client retries until it answers.
    stop = _start_follower(args, server.base_url, server.mark_weights_current)
    freeze_startup_heap("serve")
    try:
        server.serve_forever()
    finally:
        if stop is not None:
            stop.set()
    return 0


def _serve_sglang(args: argparse.Namespace) -> int:
    from rollout.inference.sglang import SGLangServer, unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        print(f"stacx serve --engine sglang: cannot run SGLang here: {reason}", file=sys.stderr)
        return 2
    server = SGLangServer(
        SGLangServer.Config(
            model_path=args.model,
            host=args.host,
            port=args.port,
            dtype=args.dtype,
            tp_size=args.tp_size,
            context_length=args.context_length,
            mem_fraction_static=args.mem_fraction_static,
            served_model_name=args.served_model_name,
            weight_version=args.weight_version,
        )
    )
    server.start()
    stop: threading.Event | None = None
    try:
        server.wait_ready()
        stop = _start_follower(args, server.base_url)
        return server.wait()
    finally:
        if stop is not None:
            stop.set()
        server.stop()
