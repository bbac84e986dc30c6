"""Real SWE-bench Verified instances (tests/benchmark_samples/swe-bench-verified-local), validated as
the harness validates them: in a session of the real gateway on the instance's image, built here by
`stacx.infra.services.swebench_images` from a local git copy of its repository, the gold patch
resolves and the empty patch does not, graded by the `swebench` verifier (the instance's eval
script and `get_eval_report`). An agent that also edited a file of the test patch still resolves:
the eval script resets those files to the base commit before applying the test patch.

The repositories' git copies come from $STACX_SWEBENCH_REPOS (`owner+name/` or `owner/name/`);
nothing is downloaded from GitHub here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacx.infra.benchmarks import build_suite
from stacx.infra.benchmarks.swebench import swebench_verifier
from stacx.infra.services.swebench_images import build_instance_image
from stacx.rollout.gateways import GatewayEnvironments
from stacx.sandbox.backends import DockerBackend
from stacx.sandbox.client import SandboxClient
from stacx.sandbox.testing import serve_gateway
from stacx.schemas.records import TaskSample

pytestmark = pytest.mark.slow

SAMPLES = Path(__file__).resolve().parents[1] / "benchmark_samples" / "swe-bench-verified-local"
ROWS = {row["instance_id"]: row for row in json.loads((SAMPLES / "test.json").read_text())}
REPOS_ENV = "STACX_SWEBENCH_REPOS"
CASES = [(iid, patch) for iid in ROWS for patch in ("gold", "empty")]
CASES += [("pallets__flask-5014", "gold+test edit"), ("django__django-16595", "gold+test edit")]


@pytest.fixture(scope="module")
def repos() -> Path:
    value = os.environ.get(REPOS_ENV, "")
    if not value or not Path(value).is_dir():
        wanted = ", ".join(sorted({row["repo"] for row in ROWS.values()}))
        pytest.fail(f"set {REPOS_ENV} to a folder with git copies of {wanted} (owner+name/ or owner/name/)")
    return Path(value)


@pytest.fixture(scope="module")
def gateway(docker_client: object) -> Iterator[str]:
    with serve_gateway(DockerBackend(), token=None) as url:
        yield url


@pytest.fixture(scope="module")
def tasks() -> dict[str, TaskSample]:
    loaded = build_suite("swe-bench-verified").load(SAMPLES)
    assert not loaded.problems
    return {task.task_id: task for task in loaded.tasks}


def _test_edit(row: dict[str, object]) -> str:
    """An agent's edit to the first file the test patch touches: it breaks that file."""
    first = str(row["test_patch"]).split("+++ b/", 1)[1].split("\n", 1)[0]
    return f"echo 'raise SystemExit(\"edited by the agent\")' >> {first}"


@pytest.mark.parametrize(("instance_id", "patch"), CASES, ids=[f"{i}-{p}" for i, p in CASES])
async def test_gold_resolves_and_empty_does_not(
    instance_id: str, patch: str, repos: Path, gateway: str, tasks: dict[str, TaskSample]
) -> None:
    row = ROWS[instance_id]
    task = tasks[instance_id]
    assert build_instance_image(row, repos) == task.image
    async with SandboxClient(SandboxClient.Config(base_url=gateway, timeout_s=600)) as client:
        session = await GatewayEnvironments(client).open(task, cpus=2, memory_mb=3072, lifetime_s=1800)
        try:
            if patch.startswith("gold"):
                applied = await session.exec("cd /testbed && git apply -v -", stdin=row["patch"],
                                             timeout_s=60)
                assert applied.exit_code == 0, applied.stderr
            if patch == "gold+test edit":
                edited = await session.exec(f"cd /testbed && {_test_edit(row)}", timeout_s=60)
                assert edited.exit_code == 0, edited.stderr
            verdict = await swebench_verifier(session, task)
        finally:
            await session.close()
    assert verdict["tests_ran"] == 1.0, verdict
    if patch.startswith("gold"):
        assert verdict == {"reward": 1.0, "fail_to_pass": 1.0, "pass_to_pass": 1.0, "tests_ran": 1.0}
    else:
        assert verdict["reward"] == 0.0 and verdict["fail_to_pass"] == 0.0 and verdict["pass_to_pass"] == 1.0
