"""The agent proxy: an OpenAI-compatible endpoint in front of the inference servers that records
every call token for token to `stacx.agent-logs` (on-call RL). See docs/oncall.md.

    from stacx.rollout.proxy import AgentProxy, ProxyServer
    with ProxyServer(ProxyServer.Config(proxy=AgentProxy.Config(upstreams=[url]), port=0)) as proxy:
        openai.OpenAI(base_url=f"{proxy.base_url}/v1", api_key="-")
"""

from stacx.rollout.proxy.app import AgentProxy, FeedbackRequest, build_interaction
from stacx.rollout.proxy.errors import ProxyConfigError, ProxyError, UnsupportedRequestError, UpstreamError
from stacx.rollout.proxy.metrics import ProxyMetrics
from stacx.rollout.proxy.recorder import EventRecorder
from stacx.rollout.proxy.render import PromptRenderer, RenderedPrompt
from stacx.rollout.proxy.routing import SessionRouter
from stacx.rollout.proxy.server import ProxyServer, upstream_model_info
from stacx.rollout.proxy.upstream import Generation, UpstreamClient

__all__ = [
    "AgentProxy",
    "EventRecorder",
    "FeedbackRequest",
    "Generation",
    "PromptRenderer",
    "ProxyConfigError",
    "ProxyError",
    "ProxyMetrics",
    "ProxyServer",
    "RenderedPrompt",
    "SessionRouter",
    "UnsupportedRequestError",
    "UpstreamClient",
    "UpstreamError",
    "build_interaction",
    "upstream_model_info",
]
