"""Harbor's `BaseEnvironment` over the STACX sandbox gateway (runs in Harbor's own venv).

`GatewayEnvironment` wraps a session the engine already opened (Terminus-2 episodes);
`GatewayTaskEnvironment` is a full Harbor environment provider that opens the session for the
task itself (`harbor trials start --environment-import-path _stacx_harbor:GatewayTaskEnvironment`,
with STACX_GATEWAY_URL and STACX_SANDBOX_TOKEN set): Harbor's own trial, agents and verifier then
run on the gateway's containers. Files travel as base64 on stdin through exec.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shlex
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

from _stacx_episode import GatewayShell
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

__all__ = ["GatewayEnvironment", "GatewayTaskEnvironment"]


class GatewayEnvironment(BaseEnvironment):
    """A STACX sandbox session seen as a Harbor environment."""

    shell: GatewayShell

    @classmethod
    def for_session(cls, shell: GatewayShell, trial_dir: Path, session_id: str) -> GatewayEnvironment:
        paths = TrialPaths(trial_dir=trial_dir)
        paths.mkdir()
        env = cls(
            environment_dir=trial_dir,
            environment_name="stacx",
            session_id=session_id,
            trial_paths=paths,
            task_env_config=EnvironmentConfig(),
        )
        env.shell = shell
        return env

    @staticmethod
    def type() -> str:
        return "stacx-gateway"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)  # gateway sandboxes have no network

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
        return await self._exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec)

    async def _exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: float | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        merged = self._merge_env(env) or {}
        prefix = "".join(f"export {k}={shlex.quote(str(v))}; " for k, v in merged.items())
        done = await asyncio.to_thread(
            self.shell.run, prefix + command, timeout_s=timeout_sec, workdir=cwd, stdin=stdin
        )
        return ExecResult(stdout=done["stdout"], stderr=done["stderr"], return_code=done["exit_code"])

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        data = base64.b64encode(Path(source_path).read_bytes()).decode()
        target = shlex.quote(target_path)
        await self._checked(f"mkdir -p $(dirname {target}) && base64 -d > {target}", stdin=data)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(str(source_dir), arcname=".")
        target = shlex.quote(target_dir)
        data = base64.b64encode(buffer.getvalue()).decode()
        await self._checked(f"mkdir -p {target} && base64 -d | tar -xzf - -C {target}", stdin=data)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        out = await self._checked(f"base64 < {shlex.quote(source_path)}")
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        Path(target_path).write_bytes(base64.b64decode(out))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        out = await self._checked(f"set -o pipefail; tar -czf - -C {shlex.quote(source_dir)} . | base64")
        Path(target_dir).mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(out)), mode="r:gz") as tar:
            tar.extractall(str(target_dir), filter="data")

    async def _checked(self, command: str, stdin: str | None = None) -> str:
        result = await self._exec(command, stdin=stdin, timeout_sec=600)
        if result.return_code != 0:
            raise RuntimeError(f"{command[:80]!r} failed ({result.return_code}): {result.stderr}")
        return result.stdout or ""


class GatewayTaskEnvironment(GatewayEnvironment):
    """Harbor environment provider: one gateway session per trial, built from the task dir.

    Where the gateway mounts its offline verifier tools (STACX_TOOLS_DIR), every command sees
    them exactly as the STACX verifier's commands do: uv/uvx, pytest wheels and python3 stand
    in for what a task's test.sh would download (this machine's sandboxes have no network)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gateway = os.environ.get("STACX_GATEWAY_URL", "http://127.0.0.1:8700").rstrip("/")
        self.token = os.environ.get("STACX_SANDBOX_TOKEN", "")
        self.tools = os.environ.get("STACX_TOOLS_DIR", "")
        self.sandbox_id: str | None = None

    async def _exec(self, command: str, **kwargs: Any) -> ExecResult:
        if self.tools:
            t = shlex.quote(self.tools)
            command = (
                f'if [ -d {t}/bin ]; then export PATH="$PATH:{t}/bin:{t}/python/bin" UV_OFFLINE=1 '
                f"UV_FIND_LINKS={t}/wheels UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR=/tmp/stacx-uv-cache "
                f"UV_NO_PROGRESS=1; fi; {command}"
            )
        return await super()._exec(command, **kwargs)

    async def _link_tools(self) -> None:
        t = shlex.quote(self.tools)
        bin_dir = '"$HOME/.local/bin"'
        await self._exec(
            f"if [ -x {t}/bin/uv ]; then mkdir -p {bin_dir}; "
            f"for u in uv uvx; do [ -e {bin_dir}/$u ] || ln -s {t}/bin/$u {bin_dir}/$u; done; "
            f"[ -e {bin_dir}/env ] || echo 'export PATH=\"$HOME/.local/bin:$PATH\"' > {bin_dir}/env; fi"
        )

    async def start(self, force_build: bool) -> None:
        spec = {"task_dir": str(Path(self.environment_dir).resolve().parent)}
        if self.task_env_config.cpus:
            spec["cpus"] = self.task_env_config.cpus
        if self.task_env_config.memory_mb:
            spec["memory_mb"] = self.task_env_config.memory_mb
        info = await asyncio.to_thread(self._call, "POST", "/v1/sessions", spec)
        self.sandbox_id = info["id"]
        self.shell = GatewayShell(
            {"gateway_url": self.gateway, "gateway_token": self.token, "sandbox_session": self.sandbox_id}
        )
        await self.ensure_dirs(self._mount_targets(writable_only=True))  # /logs/*, as cloud providers do
        if self.tools:
            await self._link_tools()

    async def stop(self, delete: bool) -> None:
        if self.sandbox_id is not None:
            await asyncio.to_thread(self._call, "DELETE", f"/v1/sessions/{self.sandbox_id}", None)
            self.sandbox_id = None

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        request = urllib.request.Request(
            self.gateway + path,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
            method=method,
        )
        with urllib.request.urlopen(request, timeout=1800) as response:
            raw = response.read()
        return json.loads(raw) if raw else {}
