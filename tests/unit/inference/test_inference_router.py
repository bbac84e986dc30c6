"""The router section and the sglang-router command line `stacx route` becomes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stacx.rollout.inference.router import RouterConfig, router_command

A, B = "http://127.0.0.1:1", "http://127.0.0.1:2/"


def test_the_command_names_every_server_and_the_cache_aware_policy() -> None:
    cmd = router_command(RouterConfig(port=4000, upstreams=[A, B], cache_threshold=0.25, extra_args=["--x"]))
    assert cmd[1:3] == ["-m", "sglang_router.launch_router"]
    workers = cmd.index("--worker-urls")
    assert cmd[workers + 1:workers + 3] == [A, B.rstrip("/")]
    assert cmd[cmd.index("--policy") + 1] == "cache_aware"
    assert cmd[cmd.index("--cache-threshold") + 1] == "0.25"
    assert cmd[cmd.index("--port") + 1] == "4000" and cmd[-1] == "--x"


def test_sglang_router_accepts_every_flag_we_pass() -> None:
    """Its own argument parser reads our command line (a renamed flag fails here, not in a run)."""
    from sglang_router.launch_router import parse_router_args

    args = parse_router_args(router_command(RouterConfig(upstreams=[A, B]))[3:])
    assert args.worker_urls == [A, B.rstrip("/")] and args.policy == "cache_aware"
    assert args.health_check_endpoint == "/health"


@pytest.mark.parametrize(
    ("fields", "word"),
    [({"cache_threshold": 1.5}, "cache_threshold"), ({"upstreams": [A, A]}, "twice"),
     ({"balance_rel_threshold": 0.5}, "balance_rel_threshold"), ({"timeout_s": 0}, "timeout_s")],
)
def test_bad_values_are_refused_with_the_field_named(fields: dict[str, object], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        RouterConfig(**fields)  # type: ignore[arg-type]


def test_stacx_route_without_servers_says_so_in_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "stacx.infra.cli", "route"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stacx route: router.upstreams is empty")
