"""STACX vs the Harbor framework on the same Harbor tasks: do both give the oracle the same reward?

    .venv/bin/python bench/parity.py --json

Tasks: every single-container recipe of the Harbor cookbook ($STACX_HARBOR_COOKBOOK, default
../shared/harbor-cookbook) and the project's own tasks (examples/tasks), on the local Docker
engine:

- STACX: the oracle as `stacx tasks check` runs it (`stacx.sandbox.checks.check_path`: a session on
  the same engine, the solution of every step, the verifier after each step);
- Harbor: `harbor trials start -a oracle` from PyPI `harbor` in its own virtual environment (the
  Terminus-2 scaffold's), i.e. Harbor's own trial runner, oracle agent and verifier. Its Docker
  provider needs `docker compose` and a bridge network, which this machine's engine does not
  have, so Harbor gets the gateway as its environment provider
  (`--environment-import-path _stacx_harbor:GatewayTaskEnvironment`).

Both sides also run a no-op agent (Harbor's `nop`; STACX's check runs one), so a verifier that
passes everything would show. Last line (JSON): oracle_agreement and noop_agreement (fractions of
tasks whose two rewards are equal), the per-task table, and why a side failed where one did.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0]).resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402

from stacx.rollout.blackbox.adapter import DRIVERS, build_external  # noqa: E402
from stacx.rollout.blackbox.venvs import ensure_python  # noqa: E402

REPO = _HERE.parent
TOKEN = "parity-bench"
COOKBOOK_SINGLE = ["dns-blacklisting", "multi-reward", "multi-step", "simple-task", "skills"]


@dataclass(kw_only=True, slots=True)
class Row:
    task: str
    source: str
    stacx: float | None = None
    harbor: float | None = None
    equal: bool = False
    stacx_noop: float | None = None
    harbor_noop: float | None = None
    noop_equal: bool = False
    stacx_error: str = ""
    harbor_error: str = ""
    stacx_s: float = 0.0
    harbor_s: float = 0.0


def task_dirs() -> list[tuple[str, Path]]:
    cookbook = Path(os.environ.get("STACX_HARBOR_COOKBOOK") or REPO.parent / "shared" / "harbor-cookbook")
    found = [
        ("cookbook", cookbook / name) for name in COOKBOOK_SINGLE if (cookbook / name / "task.toml").is_file()
    ]
    own = sorted(p.parent for p in (REPO / "examples" / "tasks").glob("*/task.toml"))
    return found + [("stacx", p) for p in own]


async def stacx_check(task_dir: Path) -> tuple[float, float | None]:
    """What `stacx tasks check` reports: the oracle's reward (every step of a multi-step task)
    and the no-op agent's."""
    from stacx.sandbox.backends import DockerBackend
    from stacx.sandbox.checks import check_path
    from stacx.sandbox.images import TaskImageBuilder
    from stacx.sandbox.sessions import SessionManager

    config = SessionManager.Config(owner=f"bench-parity-stacx-{uuid.uuid4().hex[:8]}", max_lifetime_s=3600.0)
    async with SessionManager(config, DockerBackend(), images=TaskImageBuilder()) as manager:
        check = await check_path(manager, task_dir)
    if check.oracle_reward is None:
        raise RuntimeError(check.error or "no oracle reward")
    return float(check.oracle_reward), check.noop_reward


def harbor_trial(python: str, url: str, task_dir: Path, trials: Path, agent: str) -> float:
    harbor = str(Path(python).with_name("harbor"))
    from stacx.sandbox.images import TOOLS_DIR

    env = {
        **os.environ,
        "PYTHONPATH": str(DRIVERS),
        "STACX_GATEWAY_URL": url,
        "STACX_SANDBOX_TOKEN": TOKEN,
        "STACX_TOOLS_DIR": str(TOOLS_DIR),
    }
    command = [
        harbor,
        "trials",
        "start",
        "-p",
        str(task_dir),
        "-a",
        agent,
        "--environment-import-path",
        "_stacx_harbor:GatewayTaskEnvironment",
        "--trials-dir",
        str(trials),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, cwd=trials)
    results = sorted(trials.glob("*/result.json"))
    if not results:
        raise RuntimeError(
            f"harbor wrote no result (exit {done.returncode}): {(done.stdout + done.stderr)[-1500:]}"
        )
    result = json.loads(results[-1].read_text())
    if result.get("verifier_result") is None:
        info = result.get("exception_info") or {}
        trace = "".join(p.read_text()[-4000:] for p in trials.glob("*/exception.txt"))
        raise RuntimeError(
            f"{info.get('exception_type')}: {str(info.get('exception_message'))[:300]} {trace}"
        )
    rewards = result["verifier_result"].get("rewards") or {}
    return float(rewards.get("reward", next(iter(rewards.values()), 0.0)))


def run_one(python: str, url: str, source: str, task_dir: Path) -> Row:
    row = Row(task=task_dir.name, source=source)
    started = time.monotonic()
    try:
        row.stacx, row.stacx_noop = asyncio.run(stacx_check(task_dir))
    except Exception as exc:  # one task's failure is a row of the table, not the end of the run
        row.stacx_error = f"{type(exc).__name__}: {exc}"[:400]
    row.stacx_s = round(time.monotonic() - started, 1)
    started = time.monotonic()
    for agent in ("oracle", "nop"):
        with tempfile.TemporaryDirectory(prefix="stacx-parity-") as tmp:
            try:
                reward = harbor_trial(python, url, task_dir, Path(tmp), agent)
            except Exception as exc:
                row.harbor_error += f"{agent}: {type(exc).__name__}: {exc}"[:2000]
                continue
        if agent == "oracle":
            row.harbor = reward
        else:
            row.harbor_noop = reward
    row.harbor_s = round(time.monotonic() - started, 1)
    row.equal = row.stacx is not None and row.stacx == row.harbor
    row.noop_equal = row.stacx_noop is not None and row.stacx_noop == row.harbor_noop
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--tasks", nargs="*", help="only these task names")
    args = parser.parse_args()

    from stacx.infra.services import harbor_images
    from stacx.sandbox.backends import DockerBackend
    from stacx.sandbox.images import TaskImageBuilder
    from stacx.sandbox.sessions import SessionManager
    from stacx.sandbox.testing import serve_gateway

    say = (lambda line: None) if args.json else print
    started = time.monotonic()
    python = ensure_python(build_external("terminus-2", {}))  # the same venv: PyPI harbor
    harbor_images.build(say=say)
    config = SessionManager.Config(owner=f"bench-parity-{uuid.uuid4().hex[:8]}")
    rows = []
    with serve_gateway(DockerBackend(), token=TOKEN, config=config, images=TaskImageBuilder()) as url:
        for source, task_dir in task_dirs():
            if args.tasks and task_dir.name not in args.tasks:
                continue
            row = run_one(python, url, source, task_dir)
            say(
                f"{row.task:20} oracle stacx={row.stacx} harbor={row.harbor}  no-op stacx={row.stacx_noop} "
                f"harbor={row.harbor_noop} {row.stacx_error}{row.harbor_error[:300]}"
            )
            rows.append(row)
    agree = sum(r.equal for r in rows) / max(len(rows), 1)
    print(
        json.dumps(
            {
                "bench": "parity",
                "oracle_agreement": round(agree, 4),
                "num_tasks": len(rows),
                "num_equal": sum(r.equal for r in rows),
                "noop_agreement": round(sum(r.noop_equal for r in rows) / max(len(rows), 1), 4),
                "harbor": "harbor==0.26.0 trials start -a oracle|nop, environment = STACX gateway",
                "wall_s": round(time.monotonic() - started, 1),
                "tasks": [asdict(r) for r in rows],
            }
        )
    )


if __name__ == "__main__":
    main()
