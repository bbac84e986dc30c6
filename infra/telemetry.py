"""OpenTelemetry SDK set-up for every `stacx` service, from one config section or the OTEL_* variables.

Library code (rollout, sandbox, producers, consumers, trainer) only calls the OpenTelemetry API;
this module installs the SDK in a service's process: a TracerProvider with the resource
`service.name`, a batching OTLP/HTTP exporter and the sampler. Tracing is on when the pipeline's
`tracing:` section says so (it is passed to each service as the standard variables) or when the
environment asks for OTLP: `OTEL_TRACES_EXPORTER=otlp` or an `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`;
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off. Off, nothing is installed and
the API's no-op tracer costs nothing.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TracingConfig", "setup_tracing", "shutdown_tracing"]

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://127.0.0.1:4318"
"""OTLP/HTTP on the local Jaeger that `stacx infra up` starts."""

_installed: list[object] = []


class TracingConfig(BaseModel):
    """The `tracing:` section: one place that turns tracing on for every service of a pipeline."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Export spans from every service (the standard OTEL_* variables can also turn it on)."""
    endpoint: str = DEFAULT_ENDPOINT
    """OTLP/HTTP base URL (`/v1/traces` is appended), the local Jaeger by default."""
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Fraction of traces kept (parent-based: a trace is kept or dropped as a whole)."""
    export_delay_ms: int = Field(default=1000, ge=10)
    """Longest time a finished span waits in the batch before it is exported."""

    def to_env(self) -> dict[str, str]:
        """The standard OTEL_* variables that carry this section to a service process."""
        if not self.enabled:
            return {"OTEL_TRACES_EXPORTER": "none"}
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(self.sample_ratio),
            "OTEL_BSP_SCHEDULE_DELAY": str(self.export_delay_ms),
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TracingConfig:
        """What the OTEL_* variables ask for (tracing off when they ask for nothing)."""
        env = os.environ if env is None else env
        exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or exporter == "none"
        enabled = not disabled and (exporter == "otlp" or bool(endpoint))
        if exporter not in {"", "otlp", "none"}:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER={exporter!r}: stacx services export `otlp` (or `none`); "
                "point OTEL_EXPORTER_OTLP_ENDPOINT at a collector for anything else"
            )
        ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG", "1.0") or 1.0)
        return cls(
            enabled=enabled,
            endpoint=env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT,
            sample_ratio=min(max(ratio, 0.0), 1.0),
        )


def setup_tracing(service: str, config: TracingConfig | None = None) -> bool:
    """Install the SDK for `service` (resource `service.name`, OTEL_SERVICE_NAME wins) when tracing
    is on; True if it was installed. Idempotent within a process."""
    config = config if config is not None else TracingConfig.from_env()
    if not config.enabled or _installed:
        return bool(_installed)
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    name = os.environ.get("OTEL_SERVICE_NAME") or f"stacx-{service}"
    provider = TracerProvider(
        resource=Resource.create({"service.name": name, "service.namespace": "stacx"}),
        sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
    )
    traces_url = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or f"{config.endpoint.rstrip('/')}/v1/traces"
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=traces_url), schedule_delay_millis=config.export_delay_ms
        )
    )
    trace.set_tracer_provider(provider)
    _installed.append(provider)
    atexit.register(shutdown_tracing)
    log.info(
        "tracing on: service %s exports OTLP to %s (sample ratio %.2f)", name, traces_url, config.sample_ratio
    )
    return True


def shutdown_tracing() -> None:
    """Export what is still buffered (called at exit; safe to call twice)."""
    while _installed:
        provider = _installed.pop()
        try:
            provider.shutdown()  # type: ignore[attr-defined]
        except Exception as exc:  # a backend gone at exit must not turn a clean exit into a crash
            log.warning("tracing shutdown: %s", exc)
