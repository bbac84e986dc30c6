"""Tracing overhead: rollout throughput with tracing on vs off, in one run, for two episodes.

    .venv/bin/python bench/tracing.py --json

Each round runs E retool episodes (K tool steps each) at concurrency C through the real rollout
path: the RolloutManager; every model turn a `/generate` call to a `stacx serve` process with a
tiny model (its tokens are then replaced by the scripted tool call or answer, so that every
episode runs its K tool steps); a `stacx gateway` process running each step as `python3 -` in a
real sandbox (bubblewrap by default); trajectory events published to Kafka (a topic the bench
creates and deletes). Tracing on is the plain OpenTelemetry SDK (`BatchSpanProcessor`, its OTLP
exporter) exporting every span to the local Jaeger that `stacx infra up` starts.

Two episodes are measured:
- `realistic`: each tool step takes `--tool-seconds` (1 s by default), as sandbox work does, 4
  episodes at once (at 16 the tiny model's generation saturates two cores, and the wall figure
  becomes the CPU one). `tracing_overhead` is the throughput lost, `1 - episodes/s on /
  episodes/s off` (median pair): limit 0.01.
- `light`: the tool step is `print(6*7)` (a 40–50 ms episode on 2 cores, where CPU bounds
  throughput): the overhead is `1 - cpu_off / cpu_on`, CPU seconds per episode of the worker,
  its gateway, the gateway's sandboxes and the server. Reported, not a target: no real episode
  is this short.

Each round is a pair: tracing off and tracing on, each in a fresh process with its own gateway
and server, run at the same time and measuring from the same moment after their warm-ups, so
that whatever else runs on the machine weighs on both alike (`--pairing alternate` runs them one
after the other). A round in which the bench process dropped a span (the SDK's own
`otel.sdk.processor.span.processed` counter, turned on by the bench) fails.

The last line printed is the figure object: the realistic episode's figures at the top level, the
light one's under `light`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LIMIT = 0.01
"""Throughput tracing may cost on the realistic episode."""
DEFAULT_OTLP = "http://127.0.0.1:4318"
EXPORT_SETTLE_S = 6.0
"""Longer than the services' export delay (5 s by default): their buffered spans are exported by then."""


def _round(args: argparse.Namespace, tracing: bool) -> dict[str, Any]:
    """One measured round in this process (the `--worker` mode)."""
    from stacx.infra.telemetry import TracingConfig, setup_tracing, shutdown_tracing

    section = TracingConfig(enabled=tracing, endpoint=args.otlp_endpoint, sample_ratio=args.sample_ratio)
    os.environ.update(section.to_env())  # the gateway process inherits the same setting
    os.environ["OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED"] = "true"  # the processor counts its drops
    setup_tracing("bench-rollout", section)
    try:
        return asyncio.run(_episodes(args))
    finally:
        shutdown_tracing()


async def _episodes(args: argparse.Namespace) -> dict[str, Any]:
    from bench.rollout import _manager, _policy
    from stacx.infra.heap import freeze_startup_heap
    from stacx.infra.telemetry import dropped_spans
    from stacx.rollout.adapters import KafkaTrajectoryPublisher
    from stacx.rollout.gateways import GatewayEnvironments
    from stacx.rollout.models import make_tokenizer
    from stacx.rollout.tokens import HFTokenizer
    from stacx.sandbox.client import SandboxClient
    from stacx.sandbox.testing import gateway_process

    tokenizer = HFTokenizer(make_tokenizer())
    code = f"import time; time.sleep({args.tool_seconds}); print(6*7)" if args.tool_seconds else "print(6*7)"
    policy = _policy(tokenizer, args.steps, code)
    owner = f"bench-tracing-{uuid.uuid4().hex[:8]}"
    gateway_args = (
        "--owner",
        owner,
        "--image",
        args.image,
        "--max-sessions",
        str(args.concurrency * 2),
        "--backend",
        args.backend,
    )
    with gateway_process(*gateway_args, token="bench") as (url, gateway), _server(args) as server:
        if server is not None:
            policy = ServedPolicy(policy, server[0])  # type: ignore[assignment]
        pids = [gateway.pid] + ([server[1]] if server is not None else [])
        config = SandboxClient.Config(
            base_url=url, token="bench", max_connections=args.concurrency + 16, timeout_s=600
        )
        async with SandboxClient(config) as client:
            publisher = KafkaTrajectoryPublisher(bootstrap_servers=args.bootstrap, topic=args.topic)

            def manager_of(episodes: int) -> Any:
                manager = _manager(tokenizer, policy, GatewayEnvironments(client), episodes, args.concurrency)
                manager.publisher = publisher
                for evaluator in manager.evaluators.values():
                    evaluator.config.episode_timeout_s = 3600
                    evaluator.config.step_timeout_s = 900
                return manager

            # warm-up: one-off costs (connections, lazy imports, the exporter's first export)
            # stay out of the measurement, in both settings
            await manager_of(args.concurrency).run()
            await asyncio.sleep(EXPORT_SETTLE_S)
            if args.barrier:  # a concurrent pair: both settings start their measurement together
                print("ready", flush=True)
                await asyncio.to_thread(sys.stdin.readline)
            freeze_startup_heap("rollout")  # as `stacx rollout` does once it is set up
            cpu_before = _cpu_s(pids)
            started = time.perf_counter()
            summary = await manager_of(args.episodes).run()
            wall = time.perf_counter() - started
            _flush_spans()  # the spans of the measured episodes are exported inside the window
            dropped = dropped_spans()
            await asyncio.sleep(EXPORT_SETTLE_S)  # and the gateway's and the server's too
            parts = [b - a for a, b in zip(cpu_before, _cpu_s(pids), strict=True)]
            await publisher.close()
    return {
        "episodes_per_s": summary.num_episodes / wall,
        "cpu_s_per_episode": sum(parts) / max(1, summary.num_episodes),
        "cpu_ms_per_episode_by_process": {
            name: round(part * 1000 / max(1, summary.num_episodes), 2)
            for name, part in zip(("rollout", "gateway", "sandboxes", "server"), parts, strict=False)
        },
        "completed": summary.by_status.get("COMPLETED", 0),
        "publish_errors": summary.num_publish_errors,
        "spans_dropped": dropped,
        "episodes": summary.num_episodes,
    }


def _flush_spans() -> None:
    from opentelemetry import trace

    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if flush is not None:
        flush()


def _cpu_s(pids: list[int]) -> list[float]:
    """CPU seconds used so far by this process (its threads: the engine, the producer, the span
    exporter), the gateway, the sandboxes it has reaped, and the inference server."""
    import psutil

    own = psutil.Process().cpu_times()
    parts = [own.user + own.system]
    for i, pid in enumerate(pids):
        t = psutil.Process(pid).cpu_times()
        parts.append(t.user + t.system)
        if i == 0:  # the gateway: its sandboxes apart
            parts.append(t.children_user + t.children_system)
    return parts


class ServedPolicy:
    """A real model call per turn (the served tiny model, same context and length), answered with
    the scripted turn: the inference work of the quickstart with its tool steps guaranteed."""

    def __init__(self, scripted: Any, client: Any) -> None:
        self.scripted, self.client = scripted, client

    async def generate(self, input_ids: Any, params: Any) -> Any:
        from stacx.rollout.inference.sampling import SamplingParams

        turn = await self.scripted.generate(input_ids, params)
        n = len(turn.output_ids)
        await self.client.generate(list(input_ids), SamplingParams(max_new_tokens=n, min_new_tokens=n))
        return turn


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[tuple[Any, int] | None]:
    """`stacx serve` with the quickstart's tiny model (None with --policy scripted)."""
    if args.policy == "scripted":
        yield None
        return
    import httpx

    from stacx.rollout.inference.client import InferenceClient
    from stacx.rollout.models import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny", seed=0)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        stacx = Path(sys.executable).with_name("stacx")
        cmd = [str(stacx), "serve", "--model", str(model), "--port", str(port), "--threads", "1"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{url}/health", timeout=2).is_success:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    raise SystemExit(f"stacx serve exited with {proc.returncode}")
                time.sleep(0.5)
            client = InferenceClient(InferenceClient.Config(base_url=url, timeout_s=600))
            yield client, proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _worker_cmd(args: argparse.Namespace, tracing: bool, *, barrier: bool) -> list[str]:
    cmd = [sys.executable, __file__, "--worker", "on" if tracing else "off"]
    for flag in (
        "episodes",
        "steps",
        "concurrency",
        "backend",
        "policy",
        "sample_ratio",
        "image",
        "tool_seconds",
    ):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    cmd += ["--bootstrap", args.bootstrap, "--topic", args.topic, "--otlp-endpoint", args.otlp_endpoint]
    return cmd + (["--barrier"] if barrier else [])


def _start(args: argparse.Namespace, tracing: bool, *, barrier: bool) -> subprocess.Popen[str]:
    """A worker for one setting; its stderr goes to a file (a pipe nobody reads could fill up)."""
    return subprocess.Popen(
        _worker_cmd(args, tracing, barrier=barrier),
        stdin=subprocess.PIPE if barrier else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=tempfile.TemporaryFile(mode="w+"),
        text=True,
    )


def _result(proc: subprocess.Popen[str], tracing: bool) -> dict[str, Any]:
    """The figure object a worker printed last (its round failed: exit with its stderr)."""
    out, _ = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"bench round (tracing {'on' if tracing else 'off'}) failed:\n{_stderr(proc)}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def _stderr(proc: subprocess.Popen[str]) -> str:
    stream = proc.stderr
    assert stream is not None
    stream.seek(0)
    return stream.read()[-3000:]


def _spawn_round(args: argparse.Namespace, tracing: bool) -> dict[str, Any]:
    """One setting alone in a fresh process."""
    return _result(_start(args, tracing, barrier=False), tracing)


def _spawn_pair(args: argparse.Namespace, order: tuple[str, str]) -> dict[str, dict[str, Any]]:
    """Both settings at once, each in a fresh process, measuring from the same moment: whatever
    else runs on the machine weighs on both alike. They are started and let go in `order` (the
    rounds alternate it)."""
    procs = {mode: _start(args, mode == "on", barrier=True) for mode in order}
    for mode, proc in procs.items():
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":  # warm-up done, or the worker failed
            for other in procs.values():
                other.kill()
            proc.wait(timeout=60)
            raise SystemExit(f"bench round (tracing {mode}) failed:\n{_stderr(proc)}")
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()  # `communicate` closes it
    return {mode: _result(proc, mode == "on") for mode, proc in procs.items()}


@contextlib.contextmanager
def _topic(bootstrap: str, name: str) -> Iterator[None]:
    """The trajectories topic of the run (brokers do not create topics on first use), deleted
    after the run when this bench created it."""
    from confluent_kafka.admin import AdminClient

    from stacx.infra.services.topics import ensure_topics
    from stacx.schemas.topics import TopicSpec

    (line,) = ensure_topics(bootstrap, (TopicSpec(name),))
    try:
        yield
    finally:
        if "created" in line:
            admin = AdminClient({"bootstrap.servers": bootstrap})
            for future in admin.delete_topics([name]).values():
                with contextlib.suppress(Exception):  # housekeeping only
                    future.result(timeout=30)


def _check_backend(endpoint: str) -> None:
    import httpx

    try:  # an empty OTLP/HTTP export: 2xx (or 400 for the empty body) means a receiver is there
        httpx.post(
            f"{endpoint.rstrip('/')}/v1/traces",
            content=b"",
            timeout=5,
            headers={"Content-Type": "application/x-protobuf"},
        )
    except httpx.HTTPError as exc:
        raise SystemExit(
            f"no OTLP receiver at {endpoint} ({type(exc).__name__}): start Jaeger with `stacx infra up` "
            "or pass --otlp-endpoint"
        ) from exc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only JSON")
    parser.add_argument(
        "--episode",
        choices=("both", "realistic", "light"),
        default="both",
        help="which episode to measure (both: realistic first, then light)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="off/on pairs per episode")
    parser.add_argument("--tool-seconds", type=float, default=1.0, help="length of a realistic tool step")
    parser.add_argument(
        "--pairing",
        choices=("concurrent", "alternate"),
        default="concurrent",
        help="concurrent: each pair's two settings run at once, measured from the same moment; "
        "alternate: one after the other, the order alternating",
    )
    parser.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="measured episodes per round and setting (realistic 64, light 256)",
    )
    parser.add_argument("--steps", type=int, default=2, help="tool steps per episode")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="episodes at once (realistic 4: the tool steps, not the 2-core CPU, bound its "
        "throughput, as on a rollout host; light 16)",
    )
    parser.add_argument("--backend", choices=("docker", "process"), default="process")
    parser.add_argument(
        "--policy",
        choices=("served", "scripted"),
        default="served",
        help="served: a real call to the quickstart's tiny model per turn",
    )
    parser.add_argument("--sample-ratio", type=float, default=1.0, help="traces kept with tracing on")
    parser.add_argument("--image", default="stacx/sandbox:bookworm")
    parser.add_argument("--bootstrap", default=os.environ.get("STACX_KAFKA", "127.0.0.1:9092"))
    parser.add_argument("--topic", default=f"bench.tracing.{uuid.uuid4().hex[:8]}")
    parser.add_argument(
        "--otlp-endpoint", default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", DEFAULT_OTLP)
    )
    parser.add_argument("--worker", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--barrier", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_round(args, args.worker == "on")))
        return
    _check_backend(args.otlp_endpoint)
    kinds = ("realistic", "light") if args.episode == "both" else (args.episode,)
    figures: dict[str, dict[str, Any]] = {}
    with _topic(args.bootstrap, args.topic):
        for kind in kinds:
            settings = _settings(args, kind)
            figures[kind] = _report(settings, _rounds(settings), kind)
    main_kind = kinds[0]
    print(json.dumps({**figures[main_kind], **{k: v for k, v in figures.items() if k != main_kind}}))


def _settings(args: argparse.Namespace, kind: str) -> argparse.Namespace:
    """The arguments of one episode kind: the realistic one's tool steps take `--tool-seconds`."""
    settings = argparse.Namespace(**vars(args))
    settings.tool_seconds = args.tool_seconds if kind == "realistic" else 0.0
    if settings.episodes is None:
        settings.episodes = 64 if kind == "realistic" else 256
    if settings.concurrency is None:
        settings.concurrency = 4 if kind == "realistic" else 16
    return settings


Rounds = dict[str, list[dict[str, Any]]]


def _rounds(args: argparse.Namespace) -> Rounds:
    """The figure object of each round, by setting: concurrent pairs, or alternating rounds."""
    rounds: Rounds = {"off": [], "on": [], "load": []}
    for i in range(args.rounds):
        rounds["load"].append({"load_average_1m": os.getloadavg()[0]})  # other work on the machine
        order = ("off", "on") if i % 2 == 0 else ("on", "off")
        if args.pairing == "concurrent":
            results = _spawn_pair(args, order)
        else:
            results = {mode: _spawn_round(args, mode == "on") for mode in order}
        for mode in ("off", "on"):
            result = results[mode]
            if (
                result["completed"] != result["episodes"]
                or result["publish_errors"]
                or result["spans_dropped"]
            ):
                raise SystemExit(f"round {i} ({mode}): {result}")
            rounds[mode].append(result)
            if not args.json:
                print(
                    f"round {i} tracing {mode}: {result['episodes_per_s']:.2f} episodes/s, "
                    f"{result['cpu_s_per_episode'] * 1000:.1f} CPU ms/episode "
                    f"{result['cpu_ms_per_episode_by_process']}",
                    flush=True,
                )
    return rounds


def _report(args: argparse.Namespace, rounds: Rounds, kind: str) -> dict[str, Any]:
    cpu = {mode: [r["cpu_s_per_episode"] for r in rounds[mode]] for mode in ("off", "on")}
    rates = {mode: [r["episodes_per_s"] for r in rounds[mode]] for mode in ("off", "on")}
    # light: throughput lost where CPU bounds it (2 shared cores); realistic: throughput lost
    # where the tool steps bound it. Within each pair, then the median pair.
    cpu_pairs = [1.0 - off / on for off, on in zip(cpu["off"], cpu["on"], strict=True)]
    wall_pairs = [1.0 - b / a for a, b in zip(rates["off"], rates["on"], strict=True)]
    pairs = wall_pairs if kind == "realistic" else cpu_pairs
    overhead = statistics.median(pairs)
    figures = {
        "episode": kind,
        "tool_seconds": args.tool_seconds,
        "cpu_ms_per_episode_off": round(statistics.median(cpu["off"]) * 1000, 2),
        "cpu_ms_per_episode_on": round(statistics.median(cpu["on"]) * 1000, 2),
        "cpu_ms_per_episode_by_process_off": _by_process(rounds["off"]),
        "cpu_ms_per_episode_by_process_on": _by_process(rounds["on"]),
        "overhead_by_pair": [round(x, 4) for x in pairs],
        "cpu_overhead_median_pair": round(statistics.median(cpu_pairs), 4),
        "episodes_per_s_off": round(statistics.median(rates["off"]), 2),
        "episodes_per_s_on": round(statistics.median(rates["on"]), 2),
        "rounds_off": [round(r, 2) for r in rates["off"]],
        "rounds_on": [round(r, 2) for r in rates["on"]],
        "wall_overhead_median_pair": round(statistics.median(wall_pairs), 4),
        "load_average_by_pair": [round(r["load_average_1m"], 2) for r in rounds["load"]],
        "pairing": args.pairing,
        "episodes": args.episodes,
        "steps_per_episode": args.steps,
        "concurrency": args.concurrency,
        "backend": args.backend,
        "policy": args.policy,
        "sample_ratio": args.sample_ratio,
        "tracing_overhead": round(overhead, 4),
    }
    if kind == "realistic":
        figures |= {"limit": LIMIT, "ok": overhead <= LIMIT}
    return figures


def _by_process(results: list[dict[str, Any]]) -> dict[str, float]:
    """The median over the rounds of each process's CPU ms per episode."""
    names = results[0]["cpu_ms_per_episode_by_process"]
    return {
        name: round(statistics.median(r["cpu_ms_per_episode_by_process"][name] for r in results), 2)
        for name in names
    }


if __name__ == "__main__":
    main()
