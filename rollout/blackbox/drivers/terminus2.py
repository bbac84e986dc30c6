"""Driver of Terminus-2 (Harbor's terminal agent, unchanged): Harbor's `BaseEnvironment` is
implemented over the STACX gateway (exec; files travel as base64 through exec), the model is
the episode's proxy URL through litellm. The task image needs tmux. Options: any Terminus-2
constructor argument (e.g. `parser_name`, `enable_summarize`)."""

from __future__ import annotations

import asyncio
import base64
import io
import shlex
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from _stacx_episode import GatewayShell, load_spec, write_result
from harbor.agents.terminus_2 import Terminus2
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.models.agent.context import AgentContext
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths


class GatewayEnvironment(BaseEnvironment):
    """A STACX sandbox session seen as a Harbor environment (already started by the engine)."""

    def __init__(self, shell: GatewayShell, trial_dir: Path, session_id: str) -> None:
        self.shell = shell
        paths = TrialPaths(trial_dir=trial_dir)
        paths.mkdir()
        super().__init__(
            environment_dir=trial_dir,
            environment_name="stacx",
            session_id=session_id,
            trial_paths=paths,
            task_env_config=EnvironmentConfig(),
        )

    @staticmethod
    def type() -> str:
        return "stacx-gateway"

    def _validate_definition(self) -> None:
        return None

    async def start(self, force_build: bool) -> None:
        return None

    async def stop(self, delete: bool) -> None:
        return None

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        prefix = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
        done = await asyncio.to_thread(self.shell.run, prefix + command, timeout_s=timeout_sec, workdir=cwd)
        return ExecResult(stdout=done["stdout"], stderr=done["stderr"], return_code=done["exit_code"])

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        data = base64.b64encode(Path(source_path).read_bytes()).decode()
        await self._checked(f"echo {data} | base64 -d > {shlex.quote(target_path)}")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(str(source_dir), arcname=".")
        data = base64.b64encode(buffer.getvalue()).decode()
        target = shlex.quote(target_dir)
        await self._checked(f"mkdir -p {target} && echo {data} | base64 -d | tar -xzf - -C {target}")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        out = await self._checked(f"base64 < {shlex.quote(source_path)}")
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        Path(target_path).write_bytes(base64.b64decode(out))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        out = await self._checked(f"tar -czf - -C {shlex.quote(source_dir)} . | base64")
        Path(target_dir).mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(out)), mode="r:gz") as tar:
            tar.extractall(str(target_dir), filter="data")

    async def _checked(self, command: str) -> str:
        result = await self.exec(command)
        if result.return_code != 0:
            raise RuntimeError(f"{command[:80]!r} failed ({result.return_code}): {result.stderr}")
        return result.stdout or ""


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    options = {"record_terminal_session": False, "enable_summarize": False, **(spec.get("options") or {})}
    with tempfile.TemporaryDirectory(prefix="stacx-terminus2-") as tmp:
        env = GatewayEnvironment(GatewayShell(spec), Path(tmp), spec["episode_id"])
        agent = Terminus2(
            logs_dir=Path(tmp) / "agent",
            model_name=f"openai/{spec['model_name']}",
            api_base=spec["model_base_url"],
            max_turns=spec["max_turns"],
            temperature=spec["temperature"],
            model_info={"max_input_tokens": 32768, "max_output_tokens": spec["max_new_tokens"]},
            llm_call_kwargs={"max_tokens": spec["max_new_tokens"], "api_key": spec["api_key"]},
            **options,
        )
        await agent.setup(env)
        context = AgentContext()
        await agent.run(spec["instruction"], env, context)
    return {"exit_status": "finished", "num_input_tokens": context.n_input_tokens or 0}


def main() -> None:
    spec = load_spec()
    write_result(spec, asyncio.run(run(spec)))


if __name__ == "__main__":
    main()
