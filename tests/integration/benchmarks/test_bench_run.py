"""`stacx bench run` end to end, as a user runs it: the command in its own process, the quickstart's
policy (its tiny Qwen2, untrained) on the built-in inference server, the suite samples of
tests/benchmark_samples; for the Harbor suite the sandbox gateway on Docker runs the cookbook's
tasks and their verifiers. The suite metric and its interval are checked against a hand
computation from the per-task JSON, and `stacx bench score` / `--compare` read that file back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harbor_cookbook import cookbook

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "tests" / "benchmark_samples"
TOKEN = "bench-it"
Z = 1.959963984540054


@pytest.fixture(scope="module")
def quickstart_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart's policy: `pipeline.model.tiny` of examples/quickstart.yaml, built as the
    pipeline builds it."""
    from stacx.rollout.models import make_tiny_model

    tiny = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())["pipeline"]["model"]["tiny"]
    return make_tiny_model(tmp_path_factory.mktemp("quickstart") / "tiny", **tiny)


@pytest.fixture(scope="module")
def inference_url(quickstart_model: Path) -> Iterator[str]:
    from stacx.rollout.inference import InferenceServer

    server = InferenceServer(InferenceServer.Config(model_path=str(quickstart_model), port=0, device="cpu",
                                                    torch_threads=1))
    url = server.start(timeout_s=120)
    try:
        yield url
    finally:
        server.stop()


def _stacx(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stacx.infra.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


def _wilson(successes: float, n: int) -> tuple[float, float]:
    p = successes / n
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * (p * (1 - p) / n + Z * Z / (4 * n * n)) ** 0.5 / (1 + Z * Z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _config(tmp_path: Path, inference_url: str, model: Path, **sections: Any) -> Path:
    tree = {
        "data": {"path": "unused.jsonl", "samples_per_task": 1},
        "inference": {"url": inference_url, "tokenizer": str(model)},
        "kafka": {"publish": False, "follow_weights": False},
        "progress": False,
        "manager": {"model_name": "tiny", "max_concurrent_episodes": 4,
                    "pool": {"sandboxes": 2, "cpu": 2, "memory_mb": 4096, "generations": 4},
                    "evaluators": {"default": {"max_turns": 1, "max_tokens": 512, "max_new_tokens": 24}}},
        **sections,
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.mark.timeout(600)
def test_gsm8k_end_to_end_with_the_quickstart_policy(tmp_path: Path, inference_url: str,
                                                     quickstart_model: Path) -> None:
    config = _config(tmp_path, inference_url, quickstart_model, sandbox=None)
    out = tmp_path / "gsm8k.json"
    done = _stacx("bench", "run", "gsm8k", str(config), "--from", str(SAMPLES / "gsm8k"),
                  "--samples", "3", "--k", "2", "--json", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    skipped = [line for line in done.stderr.splitlines() if line.endswith("; skipped")]
    assert len(skipped) == 3, done.stderr  # the three malformed rows, one line each
    doc = json.loads(out.read_text())
    assert doc["suite"] == "gsm8k" and doc["metric"] == "accuracy" and doc["k"] == 2
    assert doc["run"]["grader"] == "gsm8k" and doc["run"]["tasks_skipped"] == 3
    tasks = {name: t for name, t in doc["tasks"].items() if not name.startswith("skipped:")}
    assert sorted(tasks) == ["gsm8k/test-0", "gsm8k/test-1", "gsm8k/test-2"]
    assert all(len(t["sample_rewards"]) == 3 for t in doc["tasks"].values())
    assert sum(doc["run"]["by_status"].values()) == doc["run"]["episodes"] == 9
    # the three skipped rows stay in the denominator as failures, as GSM8K counts them
    assert doc["denominator"] == {"denominator": 6, "tasks not run (failures)": 3}
    # by hand: per task c/n, averaged over all 6; Wilson over them; pass@2 = 1 - C(n-c,2)/C(n,2)
    rates = [sum(s["reward"] for s in t["sample_rewards"]) / 3 for t in tasks.values()]
    assert doc["value"] == pytest.approx(sum(rates) / 6)
    assert doc["interval"] == pytest.approx(list(_wilson(sum(rates), 6)))
    passes = [{0: 0.0, 1: 1 - 1 / 3, 2: 1.0, 3: 1.0}[round(r * 3)] for r in rates]
    assert doc["extra"]["pass@2"] == pytest.approx(sum(passes) / 6)
    assert json.loads(done.stdout.strip().splitlines()[-1])["value"] == doc["value"]
    # every sample was scored by the suite's own grader (`answered` beside `reward`)
    assert all(set(s) == {"reward", "answered"} and s["reward"] in (0.0, 1.0)
               for t in tasks.values() for s in t["sample_rewards"])

    again = _stacx("bench", "score", "gsm8k", str(out), "--compare", str(out))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["value"] == doc["value"]
    assert f"accuracy: {doc['value']:.4f} -> {doc['value']:.4f} (+0.0000)" in again.stderr


@pytest.fixture(scope="module")
def gateway(sandbox_image: str) -> Iterator[str]:
    from stacx.infra.services import harbor_images
    from stacx.sandbox.backends import DockerBackend
    from stacx.sandbox.images import TaskImageBuilder
    from stacx.sandbox.sessions import SessionManager
    from stacx.sandbox.testing import serve_gateway

    harbor_images.build()
    config = SessionManager.Config(owner=f"test-bench-{uuid.uuid4().hex[:8]}", default_image=sandbox_image)
    with serve_gateway(DockerBackend(), token=TOKEN, config=config, images=TaskImageBuilder()) as url:
        yield url


@pytest.mark.timeout(900)
def test_terminal_bench_format_end_to_end_with_the_quickstart_policy(
        tmp_path: Path, inference_url: str, quickstart_model: Path, gateway: str) -> None:
    suite_dir = tmp_path / "terminal-bench"  # a Harbor dataset folder: two of the cookbook's tasks
    suite_dir.mkdir()
    for name in ("simple-task", "multi-container"):
        (suite_dir / name).symlink_to(cookbook() / name)
    config = _config(tmp_path, inference_url, quickstart_model,
                     sandbox={"url": gateway, "token_env": "BENCH_IT_TOKEN"})
    out = tmp_path / "tb.json"
    done = _stacx("bench", "run", "terminal-bench-2", str(config), "--from", str(suite_dir),
                  "--samples", "2", "--json", str(out), "--no-progress", env={"BENCH_IT_TOKEN": TOKEN})
    assert done.returncode == 0, done.stderr[-3000:]
    [skipped] = [line for line in done.stderr.splitlines() if line.endswith("; skipped")]
    assert "multi-container" in skipped and "not supported" in skipped  # unsupported: one line
    doc = json.loads(out.read_text())
    assert doc["metric"] == "mean reward"  # Harbor's Mean; the skipped task counts 0
    assert set(doc["tasks"]) == {f"skipped:{suite_dir / 'multi-container'}", "simple-task"}
    rewards = [s["reward"] for s in doc["tasks"]["simple-task"]["sample_rewards"]]
    assert len(rewards) == 2
    assert doc["value"] == pytest.approx((sum(rewards) / 2 + 0.0) / 2)
    assert doc["extra"]["success rate (reward 1)"] == pytest.approx(sum(r >= 1.0 - 1e-9 for r in rewards) / 4)
