"""`stacx bench run swe-bench-verified` end to end, as a user runs it: the command in its own process,
the quickstart's policy (its tiny Qwen2, untrained) on the built-in inference server driving the
terminal scaffold in a sandbox of the real gateway on a real instance's image (built here, see
test_swebench_instances.py), and the `swebench` verifier grading the episode. The untrained policy
resolves nothing; the verifier's components show the harness ran and graded the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from stacx.infra.services.swebench_images import build_instance_image

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "tests" / "benchmark_samples" / "swe-bench-verified-local"
INSTANCE = "pallets__flask-5014"
REPOS_ENV = "STACX_SWEBENCH_REPOS"


@pytest.fixture(scope="module")
def instances(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An instances file holding one real instance, its image built here."""
    repos = os.environ.get(REPOS_ENV, "")
    if not repos or not Path(repos).is_dir():
        pytest.fail(f"set {REPOS_ENV} to a folder with a git copy of pallets/flask")
    row = next(r for r in json.loads((LOCAL / "test.json").read_text()) if r["instance_id"] == INSTANCE)
    build_instance_image(row, Path(repos))
    path = tmp_path_factory.mktemp("swebench") / "test.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path


@pytest.fixture(scope="module")
def inference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from stacx.rollout.inference import InferenceServer
    from stacx.rollout.models import make_tiny_model

    tiny = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())["pipeline"]["model"]["tiny"]
    model = make_tiny_model(tmp_path_factory.mktemp("quickstart") / "tiny", **tiny)
    server = InferenceServer(InferenceServer.Config(model_path=str(model), port=0, device="cpu",
                                                    torch_threads=1))
    url = server.start(timeout_s=120)
    try:
        yield url, model
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(docker_client: object) -> Iterator[str]:
    from stacx.sandbox.backends import DockerBackend
    from stacx.sandbox.sessions import SessionManager
    from stacx.sandbox.testing import serve_gateway

    config = SessionManager.Config(owner=f"test-swebench-{uuid.uuid4().hex[:8]}")
    with serve_gateway(DockerBackend(), token=None, config=config) as url:
        yield url


@pytest.mark.timeout(900)
def test_bench_run_grades_a_real_instance_with_the_harness(
        tmp_path: Path, instances: Path, inference: tuple[str, Path], gateway: str) -> None:
    url, model = inference
    tree = {
        "data": {"path": "unused.jsonl", "samples_per_task": 1},
        "inference": {"url": url, "tokenizer": str(model)},
        "kafka": {"publish": False, "follow_weights": False},
        "progress": False,
        "sandbox": {"url": gateway},
        "manager": {"model_name": "tiny", "max_concurrent_episodes": 1,
                    "pool": {"sandboxes": 1, "cpu": 2, "memory_mb": 4096, "generations": 1},
                    "evaluators": {"default": {"max_turns": 1, "max_tokens": 2048, "max_new_tokens": 16}}},
    }
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump(tree))
    out = tmp_path / "swebench.json"
    done = subprocess.run([sys.executable, "-m", "stacx.infra.cli", "bench", "run", "swe-bench-verified",
                           str(config), "--from", str(instances), "--json", str(out), "--no-progress"],
                          cwd=REPO, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["metric"] == "resolved rate" and list(doc["tasks"]) == [INSTANCE]
    [sample] = doc["tasks"][INSTANCE]["sample_rewards"]
    assert sample["tests_ran"] == 1.0 and sample["reward"] == 0.0 and sample["fail_to_pass"] == 0.0, sample
    assert doc["value"] == 0.0
