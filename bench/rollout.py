"""Rollout engine benchmark: concurrency and engine overhead with a fast scripted policy.

    .venv/bin/python bench/rollout.py --json

Two parts, one run:

1. overhead: E episodes of K tool steps each, with an instant scripted policy and an instant
   in-memory environment, run (a) by the RolloutManager (scheduler, resource pools, evaluator
   loop, chat template, token/mask/logprob bookkeeping, trajectory records) and (b) as the same
   generate + exec calls made directly by a plain loop at the same concurrency.
   engine_overhead_us_per_step = (a - b) / steps.  Limit: 1000 us.
2. docker: E episodes at up to C concurrent, each in its own real Docker sandbox created through
   the sandbox gateway (`stacx gateway` in its own process, or --gateway-url), each step running
   `python3 -` in the sandbox. Reports max_concurrent_episodes (target 256), episodes_per_s,
   exec p50 and leaked containers. `--backend process` runs the same through bubblewrap.
3. two gateways: the same episodes through one gateway, then through two (own processes on
   127.0.0.1, `--gw-backend`, process by default), each gateway taking at most `--gw-sessions`
   sessions (one host's capacity) and each step an environment step of `--gw-step-s` seconds.
   The engine's pool holds as many sandboxes as the gateways take. Reports episodes_per_s for
   one and two gateways and their ratio, `two_gateway_speedup`.

The last line printed is the figure object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stacx.rollout.data import ListTaskSource  # noqa: E402
from stacx.rollout.evaluator import Evaluator  # noqa: E402
from stacx.rollout.fakes import MemoryPublisher, StaticVersion  # noqa: E402
from stacx.rollout.manager import RolloutManager  # noqa: E402
from stacx.rollout.protocols import ExecResult, Generation, SamplingParams  # noqa: E402
from stacx.rollout.tokens import ChatFormat, HFTokenizer  # noqa: E402
from stacx.schemas.records import TaskSample  # noqa: E402

LIMIT_US_PER_STEP = 1000.0
TARGET_CONCURRENT = 256
CODE = "print(6*7)"


class FastPolicy:
    """Instant scripted policy: K tool calls then the answer, chosen from the context length."""

    def __init__(
        self, tokenizer: HFTokenizer, prompt_len: int, steps: int, obs_len: int, code: str = CODE
    ) -> None:
        self.call_ids = tokenizer.encode(f"<tool_call>{code}</tool_call>")
        self.answer_ids = tokenizer.encode("<answer>42</answer><|im_end|>")
        self.prompt_len, self.steps, self.stride = prompt_len, steps, len(self.call_ids) + obs_len
        self.version = 0
        self.durations: list[float] = []

    async def generate(self, input_ids: Any, params: SamplingParams) -> Generation:
        turn = (len(input_ids) - self.prompt_len) // self.stride
        ids = self.call_ids if turn < self.steps else self.answer_ids
        return Generation(
            output_ids=list(ids),
            logprobs=[-0.5] * len(ids),
            weight_version=self.version,
            finish_reason="stop",
        )


class InstantSession:
    session_id = "instant"

    async def exec(
        self, command: str, *, stdin: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        return ExecResult(exit_code=0, stdout="42\n")

    async def verify(self) -> dict[str, float]:
        return {"reward": 1.0}

    async def close(self) -> None:
        return None


class InstantEnvironments:
    async def open(
        self, task: TaskSample, *, cpus: float, memory_mb: int, lifetime_s: float | None = None
    ) -> InstantSession:
        return InstantSession()


def _tasks(num: int) -> list[TaskSample]:
    return [
        TaskSample(task_id=f"t{i}", task_type="arith", prompt="What is 6*7?", data='{"answer": 42}')
        for i in range(num)
    ]


def _policy(tokenizer: HFTokenizer, steps: int, code: str = CODE) -> FastPolicy:
    chat = ChatFormat(tokenizer)
    evaluator = Evaluator.Config(scaffold="retool")
    from stacx.rollout.scaffolds import build_scaffold

    scaffold = build_scaffold(evaluator.scaffold)
    prompt = chat.prompt_ids(scaffold.initial_messages(_tasks(1)[0]))
    obs = tokenizer.encode(
        scaffold.observe(
            scaffold.parse("<tool_call>x</tool_call>", finish_reason="stop"),
            ExecResult(exit_code=0, stdout="42\n"),
        ).text
    )
    return FastPolicy(tokenizer, len(prompt), steps, len(obs), code)


def _manager(
    tokenizer: HFTokenizer, policy: FastPolicy, envs: Any, episodes: int, concurrency: int
) -> RolloutManager:
    evaluator = Evaluator.Config(
        scaffold="retool",
        max_turns=64,
        max_tokens=8192,
        episode={"sandboxes": 1, "memory_mb": 256},
        step={"cpu": 0.25},
    )
    config = RolloutManager.Config(
        max_concurrent_episodes=concurrency,
        evaluators={"default": evaluator},
        pool={
            "sandboxes": concurrency,
            "cpu": concurrency,
            "memory_mb": 256 * concurrency,
            "generations": concurrency,
        },
        scheduler=RolloutManager.Config().scheduler,
    )
    return RolloutManager(
        config,
        source=ListTaskSource(_tasks(episodes)),
        tokenizer=tokenizer,
        inference=policy,
        publisher=MemoryPublisher(),
        sandbox=envs,
        versions=StaticVersion(0),
    )


async def _direct(policy: FastPolicy, envs: Any, episodes: int, steps: int, concurrency: int) -> None:
    """The same generate and exec calls, without the engine."""
    slots = asyncio.Semaphore(concurrency)
    params = SamplingParams()
    prompt = [0] * policy.prompt_len

    async def episode(task: TaskSample) -> None:
        async with slots:
            session = await envs.open(task, cpus=0.25, memory_mb=256)
            ids = list(prompt)
            for _ in range(steps):
                generation = await policy.generate(ids, params)
                ids += generation.output_ids
                await session.exec("python3 -", stdin=CODE)
                ids += [0] * (policy.stride - len(generation.output_ids))
            await policy.generate(ids, params)
            await session.close()

    await asyncio.gather(*(episode(t) for t in _tasks(episodes)))


async def overhead(tokenizer: HFTokenizer, episodes: int, steps: int, concurrency: int) -> dict:
    """Best of three, alternating engine and direct runs so both see the same machine state.

    Main-thread CPU time is the headline (the engine is one asyncio thread, and CPU time does not
    count the time other processes of a shared machine hold the cores); wall time is reported too.
    """
    policy = _policy(tokenizer, steps)
    engine = {"cpu": float("inf"), "wall": float("inf")}
    direct = {"cpu": float("inf"), "wall": float("inf")}
    for _ in range(3):
        manager = _manager(tokenizer, policy, InstantEnvironments(), episodes, concurrency)
        with _timed(engine):
            summary = await manager.run()
        assert summary.by_status == {"COMPLETED": episodes}, summary.by_status
        with _timed(direct):
            await _direct(policy, InstantEnvironments(), episodes, steps, concurrency)
    num_steps = episodes * (steps + 1)  # every model turn is a step; K of them also exec

    def per_step(kind: str) -> float:
        return round((engine[kind] - direct[kind]) / num_steps * 1e6, 1)

    return {
        "overhead_episodes": episodes,
        "overhead_steps": num_steps,
        "engine_cpu_s": round(engine["cpu"], 4),
        "direct_cpu_s": round(direct["cpu"], 4),
        "engine_wall_s": round(engine["wall"], 4),
        "direct_wall_s": round(direct["wall"], 4),
        "engine_overhead_us_per_step": per_step("cpu"),
        "engine_overhead_wall_us_per_step": per_step("wall"),
    }


@contextlib.contextmanager
def _timed(best: dict[str, float]) -> Iterator[None]:
    cpu, wall = time.thread_time(), time.perf_counter()
    yield
    best["cpu"] = min(best["cpu"], time.thread_time() - cpu)
    best["wall"] = min(best["wall"], time.perf_counter() - wall)


class TimedEnvironments:
    """Wraps the gateway environments to time each exec (the sandbox's own latency)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.exec_s: list[float] = []

    async def open(
        self, task: TaskSample, *, cpus: float, memory_mb: int, lifetime_s: float | None = None
    ) -> Any:
        session = await self.inner.open(task, cpus=cpus, memory_mb=memory_mb, lifetime_s=lifetime_s)
        original = session.exec

        async def timed(command: str, **kwargs: Any) -> ExecResult:
            started = time.perf_counter()
            try:
                return await original(command, **kwargs)
            finally:
                self.exec_s.append(time.perf_counter() - started)

        session.exec = timed
        return session


async def docker(
    tokenizer: HFTokenizer, url: str, token: str | None, episodes: int, steps: int, concurrency: int
) -> dict:
    from stacx.rollout.adapters import GatewayEnvironments
    from stacx.sandbox.client import SandboxClient

    policy = _policy(tokenizer, steps)
    config = SandboxClient.Config(base_url=url, token=token, max_connections=concurrency + 16, timeout_s=600)
    async with SandboxClient(config) as client:
        envs = TimedEnvironments(GatewayEnvironments(client))
        manager = _manager(tokenizer, policy, envs, episodes, concurrency)
        for evaluator in manager.evaluators.values():  # measure, do not time out, on a slow box
            evaluator.config.episode_timeout_s = 3600
            evaluator.config.step_timeout_s = 900
        started = time.perf_counter()
        summary = await manager.run()
        wall = time.perf_counter() - started
    failed = {k: v for k, v in summary.by_status.items() if k != "COMPLETED"}
    published = manager.publisher.published  # type: ignore[attr-defined]  # MemoryPublisher
    errors = sorted({t.error or "" for t in published if t.error})[:3]
    return {
        "docker_episodes": episodes,
        "docker_steps_per_episode": steps,
        "max_concurrent_episodes": summary.max_concurrent_episodes,
        "episodes_per_s": round(summary.num_episodes / wall, 2),
        "docker_wall_s": round(wall, 2),
        "exec_p50_ms": round(statistics.median(envs.exec_s) * 1000, 1) if envs.exec_s else None,
        "docker_not_completed": failed,
        "docker_errors": errors,
    }


def _leaked(owner: str) -> int:
    import docker as docker_sdk

    client = docker_sdk.from_env()
    return len(client.containers.list(all=True, filters={"label": f"stacx.sandbox.owner={owner}"}))


@contextlib.contextmanager
def _gateway_process(owner: str, image: str, max_sessions: int, backend: str = "docker") -> Iterator[str]:
    """`stacx gateway` in its own process (as deployed: no GIL shared with the engine)."""
    from stacx.sandbox.testing import gateway_process

    args = ("--owner", owner, "--image", image, "--max-sessions", str(max_sessions), "--backend", backend)
    with gateway_process(*args, token="bench") as (url, _):
        yield url


def _docker_part(tokenizer: HFTokenizer, args: argparse.Namespace) -> dict:
    if args.gateway_url:
        token = os.environ.get("STACX_SANDBOX_TOKEN")
        return asyncio.run(
            docker(tokenizer, args.gateway_url, token, args.episodes, args.steps, args.concurrency)
        )
    owner = f"bench-rollout-{uuid.uuid4().hex[:8]}"
    sessions = max(args.concurrency * 2, 64)
    with _gateway_process(owner, args.image, sessions, args.backend) as url:
        result = asyncio.run(docker(tokenizer, url, "bench", args.episodes, args.steps, args.concurrency))
    if args.backend == "docker":
        result["leaked_containers"] = _leaked(owner)
    else:
        result["docker_backend"] = args.backend
    return result


async def _through_gateways(tokenizer: HFTokenizer, urls: list[str], args: argparse.Namespace) -> dict:
    """The episodes through `urls`, each gateway taking at most `gw_sessions` of them at once."""
    from stacx.rollout.gateways import GatewayEnvironments
    from stacx.sandbox.client import SandboxClient

    code = f"import time; time.sleep({args.gw_step_s}); print(6*7)"
    policy = _policy(tokenizer, args.steps, code)
    capacity = args.gw_sessions * len(urls)
    clients = [
        SandboxClient(
            SandboxClient.Config(base_url=u, token="bench", max_connections=capacity + 16, timeout_s=600)
        )
        for u in urls
    ]
    options = GatewayEnvironments.Config(max_sessions_per_gateway=args.gw_sessions)
    envs = GatewayEnvironments(clients, options)
    manager = _manager(tokenizer, policy, envs, args.gw_episodes, capacity)
    started = time.perf_counter()
    summary = await manager.run()
    wall = time.perf_counter() - started
    for client in clients:
        await client.aclose()
    return {
        "episodes_per_s": summary.num_episodes / wall,
        "not_completed": {k: v for k, v in summary.by_status.items() if k != "COMPLETED"},
        "load": {url: load["opened"] for url, load in envs.load().items()},
    }


def _two_gateway_part(tokenizer: HFTokenizer, args: argparse.Namespace) -> dict:
    owners = [f"bench-two-gw-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    runs: dict[int, dict] = {}
    with contextlib.ExitStack() as stack:
        urls = [
            stack.enter_context(_gateway_process(o, args.image, args.gw_sessions, args.gw_backend))
            for o in owners
        ]
        for count in (1, 2):
            runs[count] = asyncio.run(_through_gateways(tokenizer, urls[:count], args))
    one, two = runs[1]["episodes_per_s"], runs[2]["episodes_per_s"]
    return {
        "gw_backend": args.gw_backend,
        "gw_episodes": args.gw_episodes,
        "gw_sessions_per_gateway": args.gw_sessions,
        "gw_step_s": args.gw_step_s,
        "one_gateway_episodes_per_s": round(one, 2),
        "two_gateway_episodes_per_s": round(two, 2),
        "two_gateway_speedup": round(two / one, 2),
        "two_gateway_sessions_by_gateway": list(runs[2]["load"].values()),
        "two_gateway_not_completed": runs[1]["not_completed"] | runs[2]["not_completed"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only JSON")
    parser.add_argument("--episodes", type=int, default=TARGET_CONCURRENT, help="docker episodes")
    parser.add_argument("--concurrency", type=int, default=TARGET_CONCURRENT)
    parser.add_argument("--steps", type=int, default=2, help="tool steps per episode")
    parser.add_argument("--overhead-episodes", type=int, default=512)
    parser.add_argument("--image", default="stacx/sandbox:bookworm")
    parser.add_argument("--gateway-url", default=None, help="use a running gateway instead")
    parser.add_argument("--skip-docker", action="store_true", help="skip the concurrency part")
    parser.add_argument("--backend", choices=("docker", "process"), default="docker", help="concurrency part")
    parser.add_argument("--skip-two-gateways", action="store_true", help="skip the two-gateway part")
    parser.add_argument("--gw-backend", choices=("docker", "process"), default="process")
    parser.add_argument("--gw-episodes", type=int, default=96, help="episodes per two-gateway run")
    parser.add_argument("--gw-sessions", type=int, default=16, help="sessions one gateway takes")
    parser.add_argument("--gw-step-s", type=float, default=2.0, help="seconds of one environment step")
    args = parser.parse_args()

    from stacx.rollout.models import make_tokenizer

    tokenizer = HFTokenizer(make_tokenizer())
    figures = asyncio.run(overhead(tokenizer, args.overhead_episodes, args.steps, args.concurrency))
    if not args.json:
        print(json.dumps(figures), file=sys.stderr)
    if not args.skip_docker:
        figures |= _docker_part(tokenizer, args)
    if not args.skip_two_gateways:
        figures |= _two_gateway_part(tokenizer, args)
    figures |= {
        "limit_us_per_step": LIMIT_US_PER_STEP,
        "target_concurrent_episodes": TARGET_CONCURRENT,
        "overhead_ok": figures["engine_overhead_us_per_step"] < LIMIT_US_PER_STEP,
    }
    if "max_concurrent_episodes" in figures:
        figures["concurrency_ok"] = figures["max_concurrent_episodes"] >= TARGET_CONCURRENT
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
