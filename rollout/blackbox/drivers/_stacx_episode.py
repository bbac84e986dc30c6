"""What every driver shares: read the episode spec, run shell commands in the episode's sandbox
through the gateway, write the result. Standard library only: it runs in the scaffold's own
virtual environment, which has none of our packages."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

__all__ = ["GatewayShell", "load_spec", "write_result"]


def load_spec() -> dict[str, Any]:
    """The episode spec: the JSON file named on the command line or by STACX_EPISODE."""
    path = sys.argv[1] if len(sys.argv) > 1 else os.environ["STACX_EPISODE"]
    with open(path) as f:
        spec: dict[str, Any] = json.load(f)
    return spec


def write_result(spec: dict[str, Any], result: dict[str, Any]) -> None:
    with open(spec["result_path"], "w") as f:
        json.dump(result, f)


class GatewayShell:
    """`bash -c` in the episode's sandbox through the gateway's exec route."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.url = f"{spec['gateway_url'].rstrip('/')}/v1/sessions/{spec['sandbox_session']}/exec"
        self.token = spec.get("gateway_token") or ""
        self.timeout_s = float(spec.get("step_timeout_s") or 60.0)

    def run(
        self,
        command: str,
        *,
        timeout_s: float | None = None,
        workdir: str | None = None,
        stdin: str | None = None,
    ) -> dict[str, Any]:
        """The gateway's ExecResult (exit_code, stdout, stderr, timed_out, ...)."""
        limit = float(timeout_s or self.timeout_s)
        body: dict[str, Any] = {"command": command, "timeout_s": limit}
        if workdir:
            body["workdir"] = workdir
        if stdin is not None:
            body["stdin"] = stdin
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=limit + 30) as response:
                result: dict[str, Any] = json.load(response)
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"gateway exec failed: {exc.code} {exc.read()[:300]!r}") from exc
        return result
