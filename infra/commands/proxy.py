"""`stacx proxy`: the OpenAI-compatible agent proxy in front of inference servers (on-call RL)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from stacx.infra.heap import freeze_startup_heap

log = logging.getLogger("stacx.proxy")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "proxy", help="OpenAI-compatible agent proxy: records every call to stacx.agent-logs"
    )
    p.add_argument("--config", help="YAML file; its `proxy` section is ProxyServer.Config")
    p.add_argument("--upstream", action="append", help="inference server URL (repeat for several)")
    p.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8400)")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the first server's model)")
    p.add_argument("--model-name", help="model name in responses and events")
    p.add_argument("--agent-logs-topic", help="where interaction events go")
    p.add_argument("--feedback-topic", help="where POST /v1/feedback events go")
    p.add_argument("--max-buffered", type=int, help="events kept while Kafka is slow or down")
    p.add_argument("--bootstrap-servers", help="Kafka bootstrap (default: config, $STACX_KAFKA)")
    p.set_defaults(func=_proxy)


PROXY_FLAGS = {
    "host": "host",
    "port": "port",
    "bootstrap_servers": "bootstrap_servers",
    "upstream": "proxy.upstreams",
    "tokenizer": "proxy.tokenizer_path",
    "model_name": "proxy.served_model_name",
    "agent_logs_topic": "proxy.agent_logs_topic",
    "feedback_topic": "proxy.feedback_topic",
    "max_buffered": "proxy.recorder.max_buffered",
}
"""Each flag of `stacx proxy` and the field of the `proxy:` section it overrides."""


def build_config(args: argparse.Namespace) -> Any:
    """ProxyServer.Config from the YAML file (if any) and the command-line overrides."""
    from stacx.infra.config import bootstrap_servers, section_with_overrides
    from stacx.rollout.proxy import ProxyServer

    return section_with_overrides(
        args,
        "proxy",
        ProxyServer.Config,
        PROXY_FLAGS,
        defaults=lambda tree: {"bootstrap_servers": bootstrap_servers(tree)},
    )


def _topics_problem(config: Any) -> str | None:
    """Topics the proxy writes to that the cluster lacks: its events would wait for ever (or the
    broker would auto-create them with its default retention)."""
    from stacx.infra.services.topics import missing_topics
    from stacx.schemas.topics import default_bootstrap

    proxy = config.proxy
    bootstrap = config.bootstrap_servers or default_bootstrap()
    wanted = [proxy.agent_logs_topic, proxy.feedback_topic, proxy.recorder.dlq_topic]
    missing = missing_topics(bootstrap, wanted)
    if not missing:  # all there, or the cluster did not answer (the recorder retries, /health says so)
        return None
    return (
        f"no topic {', '.join(missing)} on {bootstrap}: check proxy.agent_logs_topic, "
        "proxy.feedback_topic and proxy.recorder.dlq_topic, or create them (`stacx infra up` creates "
        "the stacx.* topics)"
    )


def _proxy(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call otherwise
    from stacx.infra.config import ConfigError
    from stacx.rollout.proxy import ProxyError, ProxyServer

    try:
        config = build_config(args)
        problem = _topics_problem(config)
        if problem:
            raise ConfigError(problem)
        server = ProxyServer(config)
    except (ConfigError, ProxyError) as exc:
        print(f"stacx proxy: {exc}", file=sys.stderr)
        return 2
    freeze_startup_heap("proxy")
    server.serve_forever()
    return 0
