"""Run a Harbor task's verifier (and its oracle) in a session and read the reward.

Works over anything with `SandboxOps` (the HTTP `SandboxClient` or an in-process
`SessionManager`): copy tests/ to /tests, run `bash /tests/test.sh` with the task's verifier
timeout, then read /logs/verifier/reward.json (an object of numbers) or reward.txt (one float).
"""

from __future__ import annotations

import json
import math

from sandbox.errors import (
    RewardFileEmpty,
    RewardFileMalformed,
    RewardFileMissing,
    SandboxFileNotFound,
)
from sandbox.models import ExecResult, VerifyResult
from sandbox.paths import tar_directory
from sandbox.protocols import SandboxOps
from sandbox.tasks import HarborTask

__all__ = [
    "REWARD_JSON",
    "REWARD_TXT",
    "parse_reward_json",
    "parse_reward_text",
    "run_oracle",
    "scalar_reward",
    "verify",
]

REWARD_JSON = "/logs/verifier/reward.json"
REWARD_TXT = "/logs/verifier/reward.txt"
SOLUTION_DIR = "/tmp/solution"
_RESET = "rm -rf /tests/* /logs/verifier && mkdir -p /tests /logs/verifier /logs/agent"


def parse_reward_text(data: bytes, *, where: str = REWARD_TXT) -> float:
    """The one float in reward.txt."""
    text = data.decode("utf-8", errors="replace").strip()
    if not text:
        raise RewardFileEmpty(f"{where} is empty; test.sh must write one number such as 1 or 0.5")
    try:
        value = float(text)
    except ValueError as exc:
        raise RewardFileMalformed(f"{where} must hold one number, got {text[:80]!r}") from exc
    if not math.isfinite(value):
        raise RewardFileMalformed(f"{where} must hold a finite number, got {text[:80]!r}")
    return value


def parse_reward_json(data: bytes, *, where: str = REWARD_JSON) -> dict[str, float]:
    """The numbers of reward.json (a JSON object of name -> number)."""
    text = data.decode("utf-8", errors="replace").strip()
    if not text:
        raise RewardFileEmpty(f'{where} is empty; test.sh must write an object like {{"reward": 1}}')
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RewardFileMalformed(f"{where} is not valid JSON ({exc.msg})") from exc
    if not isinstance(doc, dict) or not doc:
        raise RewardFileMalformed(f"{where} must be a non-empty JSON object of numbers, got {text[:80]!r}")
    bad = [k for k, v in doc.items() if isinstance(v, bool) or not isinstance(v, int | float)]
    if bad:
        raise RewardFileMalformed(f"{where}: values of {bad} are not numbers")
    return {str(k): float(v) for k, v in doc.items()}


def scalar_reward(rewards: dict[str, float]) -> float:
    """`reward` when present, else the only value, else the mean of all values."""
    if "reward" in rewards:
        return rewards["reward"]
    return sum(rewards.values()) / len(rewards)


async def _read_rewards(ops: SandboxOps, session_id: str, run: ExecResult) -> dict[str, float]:
    try:
        return parse_reward_json(await ops.download(session_id, REWARD_JSON))
    except SandboxFileNotFound:
        pass
    try:
        return {"reward": parse_reward_text(await ops.download(session_id, REWARD_TXT))}
    except SandboxFileNotFound:
        tail = (run.stderr or run.stdout).strip()[-400:]
        state = "timed out" if run.timed_out else f"exited {run.exit_code}"
        raise RewardFileMissing(
            f"test.sh {state} and wrote neither {REWARD_JSON} nor {REWARD_TXT}; output: {tail!r}"
        ) from None


async def verify(ops: SandboxOps, session_id: str, task: HarborTask) -> VerifyResult:
    """Run the task's tests in the session and return the reward."""
    await ops.exec(session_id, _RESET, timeout_s=60)
    await ops.upload_archive(session_id, "/tests", tar_directory(task.tests_dir))
    run = await ops.exec(
        session_id,
        "bash /tests/test.sh",
        timeout_s=task.verifier_timeout_s,
        env=task.verifier_env,
    )
    rewards = await _read_rewards(ops, session_id, run)
    return VerifyResult(
        reward=scalar_reward(rewards),
        rewards=rewards,
        exit_code=run.exit_code,
        stdout=run.stdout,
        stderr=run.stderr,
        duration_s=run.duration_s,
        timed_out=run.timed_out,
    )


async def run_oracle(ops: SandboxOps, session_id: str, task: HarborTask) -> ExecResult:
    """Apply the reference solution (solution/solve.sh) in the session, as an agent would."""
    if not task.has_solution:
        raise FileNotFoundError(f"{task.solution_dir / 'solve.sh'} does not exist")
    await ops.upload_archive(session_id, SOLUTION_DIR, tar_directory(task.solution_dir))
    return await ops.exec(session_id, f"bash {SOLUTION_DIR}/solve.sh", timeout_s=task.agent_timeout_s)
