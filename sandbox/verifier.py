"""Run a Harbor task's verifier (and its oracle) in a session and read the reward.

Works over anything with `SandboxOps` (the HTTP `SandboxClient` or an in-process
`SessionManager`): copy tests/ (the task's, then the step's over it) to /tests, run
`bash /tests/test.sh` with the verifier timeout and `[verifier.env]`, then read
/logs/verifier/reward.json (an object of numbers: named rewards) or reward.txt (one float).
Where the offline verifier tools are mounted (`stacx.sandbox.images.TOOLS_DIR`), test.sh finds uv/uvx,
pytest wheels, python3 and curl there, as if its `curl .../uv/install.sh | sh` had worked.
"""

from __future__ import annotations

import json
import math

from stacx.sandbox.errors import (
    RewardFileEmpty,
    RewardFileMalformed,
    RewardFileMissing,
    SandboxFileNotFound,
)
from stacx.sandbox.images import PYTHON_DIR, TOOLS_DIR
from stacx.sandbox.models import ExecResult, VerifyResult
from stacx.sandbox.paths import tar_directory
from stacx.sandbox.protocols import SandboxOps
from stacx.sandbox.task_config import resolve_env
from stacx.sandbox.tasks import HarborTask, TaskStep
from stacx.sandbox.terminal import clean_text

__all__ = [
    "ORACLE_COMMAND",
    "ORACLE_ENV",
    "REWARD_JSON",
    "REWARD_TXT",
    "parse_reward_json",
    "parse_reward_text",
    "SOLUTION_DIR",
    "run_oracle",
    "scalar_reward",
    "timeout_source",
    "verify",
]

REWARD_JSON = "/logs/verifier/reward.json"
REWARD_TXT = "/logs/verifier/reward.txt"
SOLUTION_DIR = "/solution"
TESTS_DIR = "/tests"
ORACLE_COMMAND = f"chmod +x {SOLUTION_DIR}/solve.sh && {SOLUTION_DIR}/solve.sh"
"""Harbor's OracleAgent runs solve.sh itself (its shebang picks the interpreter), not `bash solve.sh`."""
ORACLE_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
"""What Harbor's OracleAgent sets for solve.sh; `[solution.env]` comes on top."""
_RESET = (
    "rm -rf /tests/* /logs/verifier && mkdir -p /tests /logs/verifier /logs/agent /logs/artifacts"
    " && chmod 777 /logs/verifier"
)
_TOOLS_SETUP = f"""if [ -x {TOOLS_DIR}/bin/uv ]; then
  mkdir -p "$HOME/.local/bin"
  for t in uv uvx; do [ -e "$HOME/.local/bin/$t" ] || ln -s {TOOLS_DIR}/bin/$t "$HOME/.local/bin/$t"; done
  [ -e "$HOME/.local/bin/env" ] || echo 'export PATH="$HOME/.local/bin:$PATH"' > "$HOME/.local/bin/env"
fi"""
"""Stands in for uv's installer: `source $HOME/.local/bin/env` then finds uv/uvx."""
_RUN_TESTS = f"""if [ -d {TOOLS_DIR}/bin ]; then
  export PATH="$PATH:{TOOLS_DIR}/bin:{TOOLS_DIR}/python/bin" UV_OFFLINE=1 UV_FIND_LINKS={TOOLS_DIR}/wheels \
    UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR=/tmp/stacx-uv-cache UV_NO_PROGRESS=1
fi
if [ -d {PYTHON_DIR} ]; then
  export UV_PYTHON_INSTALL_DIR={PYTHON_DIR}
  for _bin in {PYTHON_DIR}/*/bin; do [ -d "$_bin" ] && PATH="$PATH:$_bin"; done
fi
exec bash {TESTS_DIR}/test.sh"""


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
    """The numbers of reward.json (a JSON object of name -> number); `true`/`false` are 1/0,
    as Harbor's verifier reads them."""
    text = data.decode("utf-8", errors="replace").strip()
    if not text:
        raise RewardFileEmpty(f'{where} is empty; test.sh must write an object like {{"reward": 1}}')
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RewardFileMalformed(f"{where} is not valid JSON ({exc.msg})") from exc
    if not isinstance(doc, dict) or not doc:
        raise RewardFileMalformed(f"{where} must be a non-empty JSON object of numbers, got {text[:80]!r}")
    bad = [k for k, v in doc.items() if not isinstance(v, int | float)]  # a bool is an int, 0 or 1
    if bad:
        raise RewardFileMalformed(f"{where}: values of {bad} are not numbers")
    rewards = {str(k): float(v) for k, v in doc.items()}
    infinite = {k: v for k, v in rewards.items() if not math.isfinite(v)}
    if infinite:
        raise RewardFileMalformed(
            f"{where}: values must be finite numbers, got {infinite}; test.sh must write numbers "
            'such as {"reward": 0.5}'
        )
    return rewards


def scalar_reward(rewards: dict[str, float]) -> float:
    """`reward` when present, else the only value, else the mean of all values."""
    if "reward" in rewards:
        return rewards["reward"]
    return sum(rewards.values()) / len(rewards)


async def _read_rewards(ops: SandboxOps, session_id: str, run: ExecResult, limit: str) -> dict[str, float]:
    try:
        return parse_reward_json(await ops.download(session_id, REWARD_JSON))
    except SandboxFileNotFound:
        pass
    try:
        return {"reward": parse_reward_text(await ops.download(session_id, REWARD_TXT))}
    except SandboxFileNotFound:
        tail = clean_text(run.stdout + run.stderr).strip()[-600:]
        state = f"timed out ({limit})" if run.timed_out else f"exited {run.exit_code}"
        raise RewardFileMissing(
            f"test.sh {state} and wrote neither {REWARD_JSON} nor {REWARD_TXT}; output: {tail!r}"
        ) from None


def timeout_source(section: str, task: HarborTask, step: TaskStep) -> str:
    """The `agent` or `verifier` time limit of `step` and where it is set, e.g.
    `[verifier] timeout_sec = 30 s of tasks/x/task.toml`."""
    own = step.config.agent_timeout_s if section == "agent" else step.config.verifier_timeout_s
    timeout = own or (task.agent_timeout_s if section == "agent" else task.verifier_timeout_s)
    where = f"step {step.name}" if own else str(task.path / "task.toml")
    return f"[{section}] timeout_sec = {timeout:g} s of {where}"


def _step(task: HarborTask, step: TaskStep | None, *, last: bool) -> TaskStep:
    if step is not None:
        return step
    return task.steps[-1] if last else task.steps[0]


async def verify(
    ops: SandboxOps, session_id: str, task: HarborTask, step: TaskStep | None = None
) -> VerifyResult:
    """Run the tests of `step` (default: the task's last step) in the session and return the reward."""
    step = _step(task, step, last=True)
    await ops.exec(session_id, _RESET, timeout_s=60)
    for tests in dict.fromkeys([task.tests_dir, step.tests_dir]):
        if tests.is_dir():
            await ops.upload_archive(session_id, TESTS_DIR, tar_directory(tests))
    await ops.exec(session_id, _TOOLS_SETUP, timeout_s=60)
    where = f"{task.path}/task.toml [verifier.env]"
    env = resolve_env({**task.verifier_env, **step.config.verifier_env}, where)
    timeout = step.config.verifier_timeout_s or task.verifier_timeout_s
    run = await ops.exec(session_id, _RUN_TESTS, timeout_s=timeout, env=env)
    rewards = await _read_rewards(ops, session_id, run, timeout_source("verifier", task, step))
    return VerifyResult(
        reward=scalar_reward(rewards),
        rewards=rewards,
        exit_code=run.exit_code,
        stdout=run.stdout,
        stderr=run.stderr,
        duration_s=run.duration_s,
        timed_out=run.timed_out,
        step=step.name if task.multi_step else None,
    )


async def run_oracle(
    ops: SandboxOps, session_id: str, task: HarborTask, step: TaskStep | None = None
) -> ExecResult:
    """Apply the reference solution of `step` (default: the first) at /solution, as an agent would
    (and as Harbor's OracleAgent does: solve.sh run directly, DEBIAN_FRONTEND=noninteractive). Its
    exit status is the caller's to record: a non-zero one does not void the trial."""
    step = _step(task, step, last=False)
    if not step.has_solution:
        raise FileNotFoundError(f"{step.solution_dir / 'solve.sh'} does not exist")
    await ops.exec(session_id, f"rm -rf {SOLUTION_DIR}/* && mkdir -p {SOLUTION_DIR}", timeout_s=60)
    await ops.upload_archive(session_id, SOLUTION_DIR, tar_directory(step.solution_dir))
    env = {**ORACLE_ENV, **resolve_env(task.solution_env, f"{task.path}/task.toml [solution.env]")}
    timeout = step.config.agent_timeout_s or task.agent_timeout_s
    return await ops.exec(session_id, ORACLE_COMMAND, timeout_s=timeout, env=env)
