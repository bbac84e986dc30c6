"""OpenHands on the SWE tasks in miniature, through the real rollout engine (agent proxy, sandbox
gateway on Docker, the tasks' SWE-bench grading), for two policies on the same tiny model:

- `student`: the model samples freely (a fresh tiny model: it cannot yet write a tool call);
- `expert`: the scripted expert, the same model constrained (SGLang `regex`) to the task's gold
  edit as one OpenHands `file_editor` call, so each episode is a real OpenHands episode that
  solves the task through its own tools.

    .venv/bin/python examples/swe/run.py [--split heldout] [--policies expert student]

Needs `stacx infra up` (Docker and the sandbox image). Prints the resolved rate per policy with
a 95% Wilson interval, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_tasks import BUGS, MODULE, WORKDIR, Bug, write_tasks  # noqa: E402

TOKEN = "swe-example"


def expert_call(bug: Bug) -> str:
    """The gold edit as OpenHands' text form of a file_editor call."""
    return (
        "<function=file_editor>\n<parameter=command>str_replace</parameter>\n"
        f"<parameter=path>{WORKDIR}/{MODULE}</parameter>\n<parameter=old_str>{bug.bad}</parameter>\n"
        f"<parameter=new_str>{bug.good}</parameter>\n</function>"
    )


def evaluator(bug: Bug, policy: str) -> dict[str, object]:
    llm: dict[str, object] = {}
    if policy == "expert":
        llm = {"litellm_extra_body": {"regex": re.escape(expert_call(bug))}}
    return {
        "scaffold": "openhands",
        "scaffold_options": {"llm": llm},
        "reward": "verifier",
        "max_turns": 2,
        "max_new_tokens": 512,
        "max_tokens": 65536,
        "episode_timeout_s": 900.0,
        "episode": {"sandboxes": 1, "memory_mb": 1024},
        "step": {"cpu": 0.5},
    }


async def run_policy(
    policy: str, split: str, model_dir: Path, inference_url: str, gateway: str
) -> list[dict]:
    from stacx.rollout.adapters import GatewayEnvironments, InferenceAdapter
    from stacx.rollout.blackbox.capture import CallCapture
    from stacx.rollout.data import ListTaskSource
    from stacx.rollout.evaluator import Evaluator
    from stacx.rollout.fakes import MemoryPublisher, StaticVersion
    from stacx.rollout.inference import InferenceClient
    from stacx.rollout.manager import RolloutManager
    from stacx.rollout.tokens import HFTokenizer
    from stacx.sandbox.client import SandboxClient
    from stacx.sandbox.tasks import load_task, to_task_sample
    from stacx.schemas.records import TaskSample

    bugs = {f"inflection-{b.name}": b for b in BUGS}
    tasks = []
    for task_dir in sorted((HERE / split).iterdir()):
        sample = to_task_sample(load_task(task_dir))
        fields = {k: getattr(sample, k) for k in sample.__dataclass_fields__}
        tasks.append(TaskSample(**{**fields, "task_type": task_dir.name}))
    evaluators = {t.task_type: Evaluator.Config(**evaluator(bugs[t.task_type], policy)) for t in tasks}  # type: ignore[arg-type]
    capture = CallCapture(CallCapture.Config(upstream=inference_url, tokenizer_path=str(model_dir)))
    capture.start()
    publisher = MemoryPublisher()
    inference = InferenceClient(InferenceClient.Config(base_url=inference_url))
    config = RolloutManager.Config(
        model_name="tiny",
        evaluators=evaluators,
        pool={"sandboxes": 1, "cpu": 1, "memory_mb": 2048, "generations": 1},
    )
    try:
        async with SandboxClient(SandboxClient.Config(base_url=gateway, token=TOKEN)) as sandbox:
            manager = RolloutManager(
                config,
                source=ListTaskSource(tasks, ListTaskSource.Config(samples_per_task=1)),
                tokenizer=HFTokenizer(str(model_dir)),
                inference=InferenceAdapter(inference),
                publisher=publisher,
                sandbox=GatewayEnvironments(sandbox),
                versions=StaticVersion(0),
                capture=capture,
            )
            await manager.run()
            await manager.close()
    finally:
        await inference.close()
        capture.close()
    return [
        {
            "task": t.task_id,
            "status": t.status.name,
            "reward": t.reward,
            **t.rewards,
            "model_calls": t.metadata.get("num_model_calls"),
            "exit": t.metadata.get("scaffold_exit_status"),
        }
        for t in publisher.published
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="heldout", choices=("heldout", "train"))
    parser.add_argument("--policies", nargs="+", default=["expert", "student"], choices=("expert", "student"))
    args = parser.parse_args(argv)

    from stacx.infra.benchmarks.stats import wilson_interval
    from stacx.infra.services import harbor_images
    from stacx.rollout.inference import InferenceServer
    from stacx.rollout.models import make_tiny_model
    from stacx.sandbox.backends import DockerBackend
    from stacx.sandbox.images import TaskImageBuilder
    from stacx.sandbox.sessions import SessionManager
    from stacx.sandbox.testing import serve_gateway

    started = time.monotonic()
    if not (HERE / args.split).is_dir():  # generated, not kept in git
        write_tasks(HERE)
    harbor_images.build()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "tiny", max_position_embeddings=65536)
        server = InferenceServer(
            InferenceServer.Config(model_path=str(model_dir), port=0, device="cpu", torch_threads=1)
        )
        url = server.start(timeout_s=120)
        config = SessionManager.Config(owner=f"swe-example-{uuid.uuid4().hex[:8]}")
        try:
            with serve_gateway(
                DockerBackend(), token=TOKEN, config=config, images=TaskImageBuilder()
            ) as gateway:
                for policy in args.policies:
                    results[policy] = asyncio.run(run_policy(policy, args.split, model_dir, url, gateway))
        finally:
            server.stop()
    summary: dict[str, object] = {"split": args.split, "seconds": round(time.monotonic() - started, 1)}
    for policy, rows in results.items():
        solved = sum(r["reward"] == 1.0 for r in rows)
        low, high = wilson_interval(solved, len(rows))
        interval = f"[{100 * low:.0f}%, {100 * high:.0f}%]"
        print(f"{policy}: resolved {solved}/{len(rows)} (95% Wilson interval {interval})")
        for row in rows:
            print("   ", json.dumps(row))
        summary[policy] = {"resolved": solved, "tasks": len(rows), "interval_95": interval}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
