"""The rules that turn a Harbor `task.toml` into typed values (schema 1.x, as Harbor's `TaskConfig`).

Every field of the current schema is accepted. What STACX cannot honour is kept and reported by
`unhonoured()` as one warning line each; a field nobody knows is a warning too, never dropped
silently. Bad values raise `TaskFormatError` naming the file, the field and the fix.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from stacx.sandbox.errors import TaskFormatError

__all__ = [
    "KNOWN_FIELDS",
    "Healthcheck",
    "StepConfig",
    "parse_size_mb",
    "resolve_env",
]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B?)?\s*$", re.IGNORECASE)
_UNIT_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024.0}
_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

KNOWN_FIELDS: dict[str, set[str]] = {
    "": {
        "version",
        "schema_version",
        "task",
        "metadata",
        "verifier",
        "agent",
        "environment",
        "solution",
        "source",
        "multi_step_reward_strategy",
        "steps",
        "artifacts",
    },
    "task": {"name", "version", "description", "authors", "keywords"},
    "verifier": {
        "timeout_sec",
        "env",
        "user",
        "network_mode",
        "allowed_hosts",
        "environment_mode",
        "environment",
        "collect",
    },
    "agent": {"timeout_sec", "user", "network_mode", "allowed_hosts"},
    "environment": {
        "build_timeout_sec",
        "docker_image",
        "os",
        "cpus",
        "memory_mb",
        "memory",
        "storage_mb",
        "storage",
        "gpus",
        "gpu_types",
        "tpu",
        "mcp_servers",
        "env",
        "skills_dir",
        "healthcheck",
        "workdir",
        "allow_internet",
        "network_mode",
        "allowed_hosts",
        "network",
    },
    "solution": {"env"},
    "step": {"name", "agent", "verifier", "min_reward", "healthcheck", "artifacts"},
    "healthcheck": {
        "command",
        "interval_sec",
        "timeout_sec",
        "start_period_sec",
        "start_interval_sec",
        "retries",
    },
}
"""Field names per table (`""`: the top level, `step`: one `[[steps]]` entry)."""


def parse_size_mb(value: Any, where: str) -> int:
    """Megabytes of a size: a number (already MB) or a string such as '4G', '512M', '2GiB', '1.5g'."""
    if isinstance(value, bool):
        raise TaskFormatError(f"{where} must be a size such as '4G' or a number of MB, got {value!r}")
    if isinstance(value, int | float):
        mb = float(value)
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise TaskFormatError(
                f"{where} must be a size such as '4G', '512M' or '2GiB' (or a number of MB), got {value!r}"
            )
        number, unit = float(match.group(1)), (match.group(2) or "M").upper()
        mb = number * _UNIT_MB[unit]
    if mb <= 0:
        raise TaskFormatError(f"{where} must be positive, got {value!r}")
    return max(int(mb), 1)


def resolve_env(env: dict[str, str], where: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """`${VAR}` and `${VAR:-default}` in values, resolved from the host environment (Harbor's rule);
    an unset `${VAR}` without a default is an error naming it."""
    source = os.environ if environ is None else environ

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in source and (source[name] or default is None):
            return source[name]
        if default is not None:
            return default
        raise TaskFormatError(f"{where} needs ${{{name}}}, which is not set on this host; export {name}=...")

    return {key: _TEMPLATE.sub(substitute, value) for key, value in env.items()}


@dataclass(kw_only=True, slots=True)
class Healthcheck:
    """`[environment.healthcheck]` / `[steps.healthcheck]`: Docker HEALTHCHECK semantics."""

    command: str
    interval_s: float = 5.0
    timeout_s: float = 30.0
    start_period_s: float = 0.0
    retries: int = 3


@dataclass(kw_only=True, slots=True)
class StepConfig:
    """One `[[steps]]` entry of task.toml (the files live under steps/<name>/)."""

    name: str
    agent_timeout_s: float | None = None
    agent_user: str | None = None
    verifier_timeout_s: float | None = None
    verifier_env: dict[str, str] = field(default_factory=dict)
    verifier_user: str | None = None
    min_reward: float | dict[str, float] | None = None
    """Stop the remaining steps when this step's reward (or any named one) is below it."""
    healthcheck: Healthcheck | None = None
    artifacts: list[str] = field(default_factory=list)


# -- table readers -------------------------------------------------------------------------------
def table(doc: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise TaskFormatError(f"{where}: [{name}] must be a table, got {type(value).__name__}")
    return value


def positive(values: dict[str, Any], key: str, default: float | None, where: str) -> float | None:
    value = values.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TaskFormatError(f"{where} {key} must be a positive number, got {value!r}")
    return float(value)


def count(values: dict[str, Any], key: str, where: str) -> int:
    value = values.get(key, 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TaskFormatError(f"{where} {key} must be a whole number >= 0, got {value!r}")
    return value


def string_map(values: dict[str, Any], key: str, where: str) -> dict[str, str]:
    value = values.get(key, {})
    if not isinstance(value, dict):
        raise TaskFormatError(f'{where} {key} must be a table of NAME = "value", got {value!r}')
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def user(values: dict[str, Any], where: str) -> str | None:
    value = values.get("user")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TaskFormatError(f"{where} user must be a user name or uid, got {value!r}")
    return str(value)


def artifacts(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise TaskFormatError(f"{where} artifacts must be a list of paths, got {value!r}")
    paths: list[str] = []
    for entry in value:
        source = entry.get("source") if isinstance(entry, dict) else entry
        if not isinstance(source, str) or ".." in source.split("/"):
            raise TaskFormatError(f"{where} artifacts entry {entry!r} needs a path (source) without '..'")
        paths.append(source)
    return paths


def healthcheck(value: Any, where: str) -> Healthcheck | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("command"), str):
        raise TaskFormatError(f'{where} healthcheck must be a table with command = "..."')
    retries = value.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        raise TaskFormatError(f"{where} healthcheck retries must be a whole number >= 1, got {retries!r}")
    return Healthcheck(
        command=value["command"],
        interval_s=positive(value, "interval_sec", 5.0, f"{where} healthcheck") or 5.0,
        timeout_s=positive(value, "timeout_sec", 30.0, f"{where} healthcheck") or 30.0,
        start_period_s=float(value.get("start_period_sec", 0.0) or 0.0),
        retries=retries,
    )


def min_reward(value: Any, where: str) -> float | dict[str, float] | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()
    ):
        return {str(k): float(v) for k, v in value.items()}
    raise TaskFormatError(f"{where} min_reward must be a number or a table of name = number, got {value!r}")


def step(entry: Any, where: str) -> StepConfig:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise TaskFormatError(f'{where} every [[steps]] entry needs name = "..." (its folder under steps/)')
    name = entry["name"]
    if "/" in name or name.startswith("."):
        raise TaskFormatError(f"{where} step name {name!r} must be a plain folder name under steps/")
    here = f"{where} [[steps]] {name!r}"
    agent, verifier = table(entry, "agent", here), table(entry, "verifier", here)
    return StepConfig(
        name=name,
        agent_timeout_s=positive(agent, "timeout_sec", None, f"{here} agent"),
        agent_user=user(agent, f"{here} agent"),
        verifier_timeout_s=positive(verifier, "timeout_sec", None, f"{here} verifier"),
        verifier_env=string_map(verifier, "env", f"{here} verifier"),
        verifier_user=user(verifier, f"{here} verifier"),
        min_reward=min_reward(entry.get("min_reward"), here),
        healthcheck=healthcheck(entry.get("healthcheck"), here),
        artifacts=artifacts(entry.get("artifacts", []), here),
    )


def unknown_fields(doc: dict[str, Any]) -> list[str]:
    """`section.key` of every field the schema does not define."""
    found = [k for k in doc if k not in KNOWN_FIELDS[""]]
    for section in ("task", "verifier", "agent", "environment", "solution"):
        value = doc.get(section)
        if isinstance(value, dict):
            found += [f"{section}.{k}" for k in value if k not in KNOWN_FIELDS[section]]
    for entry in doc.get("steps") or []:
        if isinstance(entry, dict):
            found += [f"steps.{k}" for k in entry if k not in KNOWN_FIELDS["step"]]
    return found
