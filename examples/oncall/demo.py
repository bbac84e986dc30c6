"""On-call RL demo: a deployed agent improves from its users' delayed feedback while it serves.

    .venv/bin/stacx infra up                       # Kafka (once)
    .venv/bin/python examples/oncall/demo.py [--name oncall] [--minutes 9]

What runs (each service a `stacx` process started from runs/<name>/config/oncall.yaml):

    simulated users ──▶ OpenAI Agents SDK agent ──▶ stacx proxy ──▶ stacx serve (tiny policy)
          │ (delayed feedback: POST /v1/feedback)      │ agent-logs, feedback          ▲ follows
          ▼                                            ▼                               │ weights
                                         stacx oncall-join (Faust) ──▶ stacx oncall (learner,
                                                                       gate, deploy) ──┘

The policy is a tiny Qwen2 warm-started (SFT) on a mixture of right tool calls, wrong ones,
prose and malformed calls. Users are satisfied only by the right tool's answer and say so a few
seconds later. Writes runs/<name>/report.json (success_before, success_after, promotions,
rejections, median_feedback_to_deployed_s, ...) and runs/<name>/success.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import task  # noqa: E402  (the demo's task module, beside this file)

log = logging.getLogger("oncall-demo")
STACX = str(Path(sys.executable).with_name("stacx"))


@dataclass(slots=True)
class Episode:
    started: float
    ended: float
    success: bool
    session: str
    version: str


@dataclass(slots=True)
class Run:
    dir: Path
    run_id: str
    ports: dict[str, int]
    episodes: list[Episode] = field(default_factory=list)
    versions: list[tuple[float, str]] = field(default_factory=list)
    """(time, weight_version the serving server reports), on every change."""
    feedback_sent: int = 0
    started: float = field(default_factory=time.time)


# -- preparation ---------------------------------------------------------------------------------


def warm_start(run: Run, steps: int, batch_size: int) -> Path:
    """Tiny model, then SFT on the demonstration mixture; returns the SFT model directory."""
    from transformers import AutoTokenizer

    from stacx.infra.pipeline.sft import run_sft
    from stacx.rollout.models import make_tiny_model

    base = make_tiny_model(run.dir / "models" / "base", seed=0)
    task.install_chat_template(str(base))
    tokenizer = AutoTokenizer.from_pretrained(base)
    rng, mix = random.Random(0), task.Mixture()
    batches = []
    for step in range(steps):
        rows, prompt_lengths = [], []
        for _ in range(batch_size):
            q = task.sample_question(rng)
            prompt = tokenizer.apply_chat_template(
                task.messages(q),  # type: ignore[arg-type]
                tools=task.TOOLS,  # type: ignore[arg-type]
                add_generation_prompt=True,
                tokenize=False,
            )
            ids = tokenizer.encode(prompt, add_special_tokens=False)
            answer = tokenizer.encode(
                task.demonstration(q, rng, mix) + "<|im_end|>", add_special_tokens=False
            )
            rows.append((ids + answer, [0] * len(ids) + [1] * len(answer)))
            prompt_lengths.append(len(ids))
        batches.append(sft_batch(rows, step, prompt_lengths))
    started = time.time()
    sft = run_sft(base, run.dir / "models", batches, lr=3e-3, warmup_steps=10, export_name="sft")
    log.info("SFT: %d steps in %.0f s -> %s", steps, time.time() - started, sft)
    return sft


def sft_batch(rows: list[tuple[list[int], list[int]]], step: int, prompt_lengths: list[int]) -> Any:
    import numpy as np

    from stacx.schemas.records import TrainingBatch

    lengths = np.array([len(ids) for ids, _ in rows], dtype=np.int32)
    n = len(rows)
    return TrainingBatch(
        batch_id=f"oncall-sft-{step:05d}",
        model_name="policy",
        trajectory_ids=[f"sft-{step}-{i}" for i in range(n)],
        group_ids=[f"sft-{step}-{i}" for i in range(n)],
        task_types=["sft"] * n,
        policy_versions=np.zeros(n, dtype=np.int32),
        offsets=np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32),
        lengths=lengths,
        prompt_lengths=np.asarray(prompt_lengths, dtype=np.int32),
        token_ids=np.concatenate([np.asarray(ids, dtype=np.int32) for ids, _ in rows]),
        loss_mask=np.concatenate([np.asarray(mask, dtype=np.uint8) for _, mask in rows]),
        logprobs=np.zeros(int(lengths.sum()), dtype=np.float32),
        rewards=np.zeros(n, dtype=np.float32),
    )


def write_config(run: Run, sft_dir: Path) -> Path:
    tree = yaml.safe_load((HERE / "oncall.yaml").read_text())
    rid = run.run_id
    topics = {"agent_logs_topic": f"stacx.agent-logs.{rid}", "feedback_topic": f"stacx.feedback.{rid}"}
    tree["proxy"]["port"] = run.ports["proxy"]
    tree["proxy"]["proxy"].update(
        upstreams=[f"http://127.0.0.1:{run.ports['serve']}"], served_model_name="policy", **topics
    )
    tree["join"].update(
        app_id=f"stacx-oncall-join-{rid}",
        trajectories_topic=f"stacx.oncall.trajectories.{rid}",
        datadir=str(run.dir / "join"),
        **topics,
    )
    tree["oncall"].update(
        state_dir=str(run.dir / "learner"),
        model_name=f"oncall-{rid}",
        trajectories_topic=f"stacx.oncall.trajectories.{rid}",
        group_id=f"stacx-oncall-learner-{rid}",
    )
    heldout = run.dir / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(t) + "\n" for t in task.heldout_tasks(64)))
    tree["evaluation"].update(tasks_path=str(heldout), scorer=f"{HERE / 'task.py'}:score")
    tree["trainer"]["models"]["policy"]["path"] = str(sft_dir)
    path = run.dir / "config" / "oncall.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


# -- services --------------------------------------------------------------------------------------


class Services:
    """The run's `stacx` processes, supervised as `stacx run` would: one that exits is restarted
    (it resumes from committed offsets), at most `max_restarts` times; each is ended by its pid."""

    def __init__(self, run: Run, max_restarts: int = 5) -> None:
        self.run = run
        self.max_restarts = max_restarts
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.commands: dict[str, tuple[str, ...]] = {}
        self.restarts: list[dict[str, Any]] = []

    def start(self, name: str, *args: str) -> None:
        logs = self.run.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = (logs / f"{name}.log").open("ab")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.commands[name] = args
        self.procs[name] = subprocess.Popen(
            [STACX, *args], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env
        )
        log.info("started %s (pid %d)", name, self.procs[name].pid)

    def check(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                continue
            tail = (self.run.dir / "logs" / f"{name}.log").read_text()[-2000:]
            if sum(r["service"] == name for r in self.restarts) >= self.max_restarts:
                raise RuntimeError(f"{name} exited with {proc.returncode} too often:\n{tail}")
            log.warning(
                "%s exited with %s: restarting it (log: %s)",
                name,
                proc.returncode,
                self.run.dir / "logs" / f"{name}.log",
            )
            self.restarts.append(
                {"service": name, "exit": proc.returncode, "t_s": round(time.time() - self.run.started, 1)}
            )
            self.start(name, *self.commands[name])

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop on SIGTERM: killing pid %d", name, proc.pid)
                proc.kill()


def wait_http(url: str, timeout_s: float, services: Services) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        services.check()
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")


def watch_versions(run: Run, stop: threading.Event) -> None:
    url = f"http://127.0.0.1:{run.ports['serve']}/get_model_info"
    while not stop.is_set():
        try:
            version = str(httpx.get(url, timeout=5).json()["weight_version"])
            if not run.versions or run.versions[-1][1] != version:
                run.versions.append((time.time(), version))
                log.info("serving version %s", version)
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        stop.wait(0.25)


# -- users -----------------------------------------------------------------------------------------


def build_agent(proxy_url: str) -> Any:
    from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no trace export: nothing leaves this machine

    @function_tool
    def get_weather() -> str:
        """Weather now."""
        return task.tool_output("get_weather")

    @function_tool
    def get_time() -> str:
        """Time now."""
        return task.tool_output("get_time")

    client = AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=5, timeout=120)
    return Agent(
        name="support",
        instructions=task.INSTRUCTIONS,
        tools=[get_weather, get_time],
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
        tool_use_behavior="stop_on_first_tool",
    )


async def user(
    run: Run, agent: Any, http: httpx.AsyncClient, proxy_url: str, seed: int, deadline: float
) -> None:
    from agents import ModelSettings, Runner

    rng = random.Random(seed)
    while time.time() < deadline:  # a question, the agent's answer, feedback a few seconds later
        question, session = task.sample_question(rng), f"user{seed}-{uuid.uuid4().hex[:12]}"
        settings = ModelSettings(temperature=1.0, max_tokens=64, extra_headers={"X-Stacx-Session": session})
        started = time.time()
        version = run.versions[-1][1] if run.versions else "?"
        try:
            result = await Runner.run(agent.clone(model_settings=settings), question.text, max_turns=2)
            ok = task.satisfied(question, str(result.final_output))
        except Exception as exc:  # an agent-side failure is a dissatisfied user
            log.debug("episode failed: %s", exc)
            ok = False
        run.episodes.append(Episode(started, time.time(), ok, session, version))
        asyncio.get_running_loop().create_task(
            feedback(run, http, proxy_url, session, ok, rng.uniform(0.5, 4.0))
        )
        await asyncio.sleep(rng.uniform(0.0, 0.3))


async def feedback(
    run: Run, http: httpx.AsyncClient, proxy_url: str, session: str, ok: bool, delay_s: float
) -> None:
    await asyncio.sleep(delay_s)
    body = {
        "session_id": session,
        "reward": 1.0 if ok else 0.0,
        "source": "user",
        "metadata": {"feedback_id": f"fb-{session}"},
    }
    try:
        await http.post(f"{proxy_url}/v1/feedback", json=body)
        run.feedback_sent += 1
    except httpx.HTTPError as exc:
        log.warning("feedback not sent: %s", exc)


async def serve_users(run: Run, services: Services, proxy_url: str, num_users: int, seconds: float) -> None:
    agent = build_agent(proxy_url)
    deadline = time.time() + seconds
    async with httpx.AsyncClient(timeout=30) as http:
        await asyncio.gather(
            watchdog(services, deadline),
            *(user(run, agent, http, proxy_url, seed, deadline) for seed in range(num_users)),
        )
        await asyncio.sleep(4.5)  # the last feedback


async def watchdog(services: Services, deadline: float) -> None:
    """Stop the demo with the service's log tail as soon as one of them dies."""
    while time.time() < deadline:
        services.check()
        await asyncio.sleep(2.0)


# -- report ----------------------------------------------------------------------------------------


def rate(episodes: list[Episode]) -> float | None:
    return round(sum(e.success for e in episodes) / len(episodes), 4) if episodes else None


def report(
    run: Run, history: list[dict[str, Any]], minutes_users: float, restarts: list[dict[str, Any]]
) -> dict[str, Any]:
    deployed_at = {v: t for t, v in run.versions}
    promoted = [e for e in history if e["kind"] == "promoted"]
    latencies = []
    for entry in promoted:
        at = deployed_at.get(str(entry["deployed_version"]))
        if at is not None:
            latencies += [at - ms / 1000 for ms in entry.get("first_feedback_ms", []) if ms > 0]
    first_version = run.versions[0][1] if run.versions else "default"
    before = [e for e in run.episodes if e.version == first_version]
    end = max((e.ended for e in run.episodes), default=time.time())
    after = [e for e in run.episodes if e.started >= end - 90]  # the last 90 s of serving
    baseline: dict[str, Any] = next((e["report"] for e in history if e["kind"] == "baseline"), {})
    best = promoted[-1]["report"] if promoted else baseline
    return {
        "success_before": rate(before),
        "success_after": rate(after),
        "promotions": len(promoted),
        "rejections": sum(1 for e in history if e["kind"] == "rejected"),
        "median_feedback_to_deployed_s": round(statistics.median(latencies), 2) if latencies else None,
        "heldout_success_before": baseline.get("success_rate"),
        "heldout_success_after": best.get("success_rate"),
        "heldout_malformed_before": baseline.get("probe_rate"),
        "heldout_malformed_after": best.get("probe_rate"),
        "episodes": len(run.episodes),
        "episodes_before": len(before),
        "episodes_after": len(after),
        "feedback_sent": run.feedback_sent,
        "versions_served": [{"t_s": round(t - run.started, 1), "version": v} for t, v in run.versions],
        "decisions": [
            {k: e.get(k) for k in ("kind", "step", "deployed_version", "reasons")}
            | {"success": (e.get("report") or {}).get("success_rate")}
            for e in history
        ],
        "users_minutes": minutes_users,
        "service_restarts": restarts,
        "wall_s": round(time.time() - run.started, 1),
        "curve_png": str(run.dir / "success.png"),
    }


def plot(run: Run, history: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    episodes = sorted(run.episodes, key=lambda e: e.ended)
    if not episodes:
        return
    t0 = episodes[0].started
    xs, ys = [], []
    for e in episodes:
        window = [w for w in episodes if e.ended - 30 <= w.ended <= e.ended]
        xs.append(e.ended - t0)
        ys.append(sum(w.success for w in window) / len(window))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(xs, ys, label="user success (30 s window)")
    deployed = {str(e["deployed_version"]) for e in history if e["kind"] == "promoted"}
    for t, v in run.versions[1:]:
        if v in deployed:
            ax.axvline(t - t0, color="green", alpha=0.4, linestyle="--")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1)
    ax.set_title("deployed agent: success while it serves (dashed: promoted versions)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)


# -- main ------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", default="oncall")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs")
    parser.add_argument("--minutes", type=float, default=9.0, help="how long users are served")
    parser.add_argument("--users", type=int, default=8, help="concurrent simulated users")
    parser.add_argument("--sft-steps", type=int, default=400)
    parser.add_argument("--port-base", type=int, default=30020)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai", "agents"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    ports = {"serve": args.port_base, "proxy": args.port_base + 1}
    run = Run(dir=args.runs_dir / args.name, run_id=uuid.uuid4().hex[:8], ports=ports)
    run.dir.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(1)  # tiny model, busy 2-core machine: one thread is fastest
    sft_dir = warm_start(run, args.sft_steps, 32)
    config = write_config(run, sft_dir)
    tree = yaml.safe_load(config.read_text())
    services, stop = Services(run), threading.Event()
    watcher = threading.Thread(target=watch_versions, args=(run, stop), daemon=True)
    try:
        services.start(
            "serve",
            "serve",
            "--model",
            str(sft_dir),
            "--port",
            str(ports["serve"]),
            "--threads",
            "1",
            "--served-model-name",
            "policy",
            "--follow-weights",
            tree["oncall"]["model_name"],
        )
        wait_http(f"http://127.0.0.1:{ports['serve']}/health", 120, services)
        services.start("join", "oncall-join", str(config), "--loglevel", "warning")
        services.start("proxy", "proxy", "--config", str(config))
        services.start("learner", "oncall", str(config))
        proxy_url = f"http://127.0.0.1:{ports['proxy']}"
        wait_http(f"{proxy_url}/health", 120, services)
        watcher.start()
        asyncio.run(serve_users(run, services, proxy_url, args.users, args.minutes * 60))
    finally:
        stop.set()
        services.stop()
    history = [json.loads(line) for line in (run.dir / "learner" / "versions.jsonl").read_text().splitlines()]
    plot(run, history, run.dir / "success.png")
    with (run.dir / "episodes.jsonl").open("w") as f:
        for e in run.episodes:
            f.write(
                json.dumps(
                    {
                        "started": e.started,
                        "ended": e.ended,
                        "success": e.success,
                        "session": e.session,
                        "version": e.version,
                    }
                )
                + "\n"
            )
    summary = report(run, history, args.minutes, services.restarts)
    (run.dir / "report.json").write_text(json.dumps(summary, indent=2))
    print(
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "success_before",
                    "success_after",
                    "promotions",
                    "rejections",
                    "median_feedback_to_deployed_s",
                    "wall_s",
                )
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
