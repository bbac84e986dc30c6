"""The three HTTP services (inference server, agent proxy, sandbox gateway) served in-process over
real HTTP with short limits, for the hostile-input and fuzz tests."""

from hostile_services import gateway_service, proxy_service, server_service, service  # noqa: F401
from inference_fixtures import _one_torch_thread, tiny_model_dir  # noqa: F401
