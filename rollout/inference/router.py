"""The router in front of several inference servers: SGLang's own `sglang-router` (PyPI, Rust).

`stacx route` runs `python -m sglang_router.launch_router` with the `cache_aware` policy over
servers of any engine (each speaks SGLang's API: the built-in server, vLLM behind its bridge,
SGLang). Group affinity comes from that policy: a request goes to the server whose radix tree
holds the longest prefix of it when that covers `cache_threshold` of it, so the samples of one
prompt group, which share their whole prompt, land on one server (one prefill, the rest from its
cache); load wins over a partial prefix only while the servers' loads differ by more than both
balance thresholds. The router checks each server's `/health` and routes around one that fails
(`stacx run` restarts it; the router takes it back once it answers again) and retries a failed
request on another server.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

__all__ = ["RouterConfig", "router_command"]


@dataclass(kw_only=True, slots=True)
class RouterConfig:
    """`sglang-router` in front of several inference servers (`stacx route`; `stacx run` starts one
    when `inference.servers` > 1 and fills `host`, `port` and `upstreams`)."""

    host: str = "127.0.0.1"
    """Interface to listen on."""
    port: int = 30000
    """TCP port (the URL the rollout and the evaluations use)."""
    upstreams: list[str] = field(default_factory=list)
    """Base URLs of the inference servers."""
    policy: str = "cache_aware"
    """sglang-router policy: cache_aware (group affinity), round_robin, power_of_two, random."""
    cache_threshold: float = 0.5
    """Share of a request's prefix a server must already hold for the prefix to decide."""
    balance_abs_threshold: int = 2
    """In-flight difference (busiest - least busy) above which load overrides partial prefixes
    (low: prompts of an RL rollout share a template, so a new group would otherwise follow the
    template to the first server)."""
    balance_rel_threshold: float = 1.5
    """... and only when the busiest has more than this times the least busy one's load."""
    max_tree_size: int = 2**24
    """Prefix-tree nodes kept per server before the least recently used are evicted."""
    health_check_interval_s: int = 1
    """How often every server's `/health` is asked (a down one comes back once it answers 200)."""
    timeout_s: int = 600
    """Per forwarded request (a long generation holds the call open)."""
    extra_args: list[str] = field(default_factory=list)
    """More `sglang_router.launch_router` flags, passed through verbatim."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold={self.cache_threshold}: use 0..1")
        if self.balance_rel_threshold < 1.0 or self.balance_abs_threshold < 0:
            raise ValueError("balance_rel_threshold >= 1 and balance_abs_threshold >= 0")
        if len(set(self.upstreams)) != len(self.upstreams):
            raise ValueError(f"upstreams lists a server twice: {self.upstreams}")
        if self.health_check_interval_s < 1 or self.timeout_s < 1 or self.max_tree_size < 1:
            raise ValueError("health_check_interval_s, timeout_s and max_tree_size must be >= 1")


def router_command(config: RouterConfig, python: str = sys.executable) -> list[str]:
    """The `sglang_router.launch_router` command line this config describes."""
    c = config
    return [
        python, "-m", "sglang_router.launch_router", "--host", c.host, "--port", str(c.port),
        "--worker-urls", *[u.rstrip("/") for u in c.upstreams], "--policy", c.policy,
        "--cache-threshold", str(c.cache_threshold),
        "--balance-abs-threshold", str(c.balance_abs_threshold),
        "--balance-rel-threshold", str(c.balance_rel_threshold),
        "--max-tree-size", str(c.max_tree_size),
        "--health-check-interval-secs", str(c.health_check_interval_s),
        "--health-check-endpoint", "/health",
        "--request-timeout-secs", str(c.timeout_s),
        "--log-level", "warn",
        *c.extra_args,
    ]
