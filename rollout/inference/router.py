"""The router in front of several inference servers: SGLang's own `sglang-router` (PyPI, Rust).

`stacx route` runs `python -m sglang_router.launch_router` with the `cache_aware` policy over
servers of any engine (each speaks SGLang's API: the built-in server, vLLM behind its bridge,
SGLang). Group affinity comes from that policy: a request goes to the server whose radix tree
holds the longest prefix of it when that covers `cache_threshold` of it, so the samples of one
prompt group, which share their whole prompt, land on one server (one prefill, the rest from its
cache); a prompt no server holds goes to the least loaded server (on a tie, the first of the
router's own list). Load decides over any prefix while the servers' loads differ by more than both
balance thresholds, so `balance_abs_threshold` is set above a group's size (a lower one splits
groups). The router checks each server's `/health` and routes around one that fails (`stacx run`
restarts it; the router takes it back once it answers again) and retries a failed request on
another server.
"""

from __future__ import annotations

import socket
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
    balance_abs_threshold: int = 32
    """In-flight difference (busiest - least busy) above which load decides over any prefix. Keep
    it above the samples of one group sent at once (`samples_per_task`): sglang-router lets load
    win over a whole-prompt match too, so a lower value splits a group across servers."""
    balance_rel_threshold: float = 1.5
    """... and only when the busiest has more than this times the least busy one's load."""
    max_tree_size: int = 2**24
    """Prefix-tree nodes kept per server before the least recently used are evicted."""
    health_check_interval_s: int = 1
    """How often every server's `/health` is asked (a down one comes back once it answers 200)."""
    timeout_s: int = 600
    """Per forwarded request (a long generation holds the call open)."""
    breaker_timeout_s: int = 5
    """Seconds a server's circuit stays open after repeated failures before it is tried again
    (sglang-router's default, 60, keeps a restarted server idle for a minute after it is back)."""
    prometheus_port: int = 0
    """Port of the router's Prometheus metrics; 0: a free one, chosen when it starts (its default,
    29000, is shared by every router on the machine)."""
    extra_args: list[str] = field(default_factory=list)
    """More `sglang_router.launch_router` flags, passed through verbatim."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold={self.cache_threshold}: use 0..1")
        if self.balance_rel_threshold < 1.0 or self.balance_abs_threshold < 0:
            raise ValueError("balance_rel_threshold >= 1 and balance_abs_threshold >= 0")
        if len(set(self.upstreams)) != len(self.upstreams):
            raise ValueError(f"upstreams lists a server twice: {self.upstreams}")
        if not 0 <= self.prometheus_port <= 65535:
            raise ValueError(f"prometheus_port={self.prometheus_port}: use 0..65535 (0: a free port)")
        if min(self.health_check_interval_s, self.timeout_s, self.max_tree_size, self.breaker_timeout_s) < 1:
            raise ValueError("health_check_interval_s, timeout_s, max_tree_size, breaker_timeout_s: >= 1")


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def router_command(config: RouterConfig, python: str = sys.executable) -> list[str]:
    """The `sglang_router.launch_router` command line this config describes."""
    c = config
    metrics_port = c.prometheus_port or _free_port(c.host)
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
        "--cb-timeout-duration-secs", str(c.breaker_timeout_s),
        "--prometheus-host", c.host, "--prometheus-port", str(metrics_port),
        "--log-level", "warn",
        *c.extra_args,
    ]
