"""OTLP/HTTP span export with a protobuf encoder written for the SDK's spans.

The SDK's exporter builds a protobuf object for every span, attribute and value of a batch (and
hashes each span's resource through `json.dumps` to group them): ~25 µs a span in a tight loop,
more in a busy service. `encode_spans` writes the same `ExportTraceServiceRequest` bytes straight
from the spans (the tests compare them byte for byte with the SDK's encoder and decode them with
the official protobuf classes). A batch holding anything it does not write (a mapping-valued
attribute, an integer beyond 64 bits, a string that is not UTF-8 clean) is encoded by the SDK's
encoder instead, and so is every batch when the SDK's exporter no longer has the parts
`FastOTLPSpanExporter` sends through.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.common._internal import (
    _encode_instrumentation_scope,
    _encode_resource,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind

__all__ = ["FastOTLPSpanExporter", "encode_spans"]

log = logging.getLogger(__name__)

_KINDS = {
    SpanKind.INTERNAL: b"\x30\x01",
    SpanKind.SERVER: b"\x30\x02",
    SpanKind.CLIENT: b"\x30\x03",
    SpanKind.PRODUCER: b"\x30\x04",
    SpanKind.CONSUMER: b"\x30\x05",
}
"""Span field 6 (kind) with the OTLP value of each kind."""

_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)
"""Span field 16 (flags, fixed32): the parent (or a link's context) is known to be local or remote."""

_LINK_FLAGS_LOCAL = b"\x35" + struct.pack("<I", 0x100)
_LINK_FLAGS_REMOTE = b"\x35" + struct.pack("<I", 0x300)
"""Link field 6 (flags, fixed32)."""

_SMALL = [bytes((n,)) for n in range(128)]
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_CANON_LIMIT = 64
"""Distinct resources or scopes an exporter keeps encoded (a service has one resource, a few scopes)."""
_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack


class _Unsupported(Exception):
    """Something the SDK's encoder is left to write."""


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: `tag`, the payload's length, the payload."""
    return tag + _varint(len(payload)) + payload


def _value(value: Any) -> bytes:
    """An `AnyValue` message (without its own tag and length)."""
    kind = type(value)
    if kind is str:
        return _field(b"\x0a", value.encode())
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        return b"\x18" + _int64(value)
    if kind is float:
        return b"\x21" + _pack_double(value)
    return _other_value(value)


def _other_value(value: Any) -> bytes:
    """The SDK encoder's order of checks, for subclasses, bytes, None and sequences."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return _value(bool(value))
    if isinstance(value, str):
        return _value(str(value))
    if isinstance(value, int):
        return _value(int(value))
    if isinstance(value, float):
        return _value(float(value))
    if isinstance(value, bytes):
        return _field(b"\x3a", bytes(value))
    if isinstance(value, Sequence):
        values = b"".join(_field(b"\x0a", _value(v)) for v in value)
        return _field(b"\x2a", values)
    raise _Unsupported(type(value).__name__)


def _int64(value: int) -> bytes:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _Unsupported("integer beyond 64 bits")
    return _varint(value & 0xFFFFFFFFFFFFFFFF)


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Repeated `KeyValue` field `tag`."""
    if not attributes:
        return b""
    out = []
    for key, value in attributes.items():
        kind = type(value)
        if kind is str or kind is int or kind is bool:  # not floats: -0.0 == 0.0
            cache_key = (key, kind, value)
            pair = _PAIRS.get(cache_key)
            if pair is None:
                if len(_PAIRS) >= _PAIRS_LIMIT:
                    _PAIRS.clear()
                pair = _PAIRS[cache_key] = _pair(key, value)
        else:
            pair = _pair(key, value)
        out.append(_field(tag, pair))
    return b"".join(out)


_PAIRS: dict[tuple[str, type, Any], bytes] = {}
"""`KeyValue` messages of string, integer and boolean attributes met lately (most repeat: the
operation, the model, the method)."""
_PAIRS_LIMIT = 4096


def _pair(key: str, value: Any) -> bytes:
    if type(key) is not str:
        raise _Unsupported("attribute key")
    return (_field(b"\x0a", key.encode()) if key else b"") + _field(b"\x12", _value(value))


_NAMES: dict[str, bytes] = {}
"""Span name fields met lately (a service makes spans of a few names)."""


def _attribute_values(span: ReadableSpan) -> Mapping[str, Any] | None:
    """The span's attributes: the dict inside the SDK's `BoundedAttributes` (an ended span's do
    not change), else the public read-only view."""
    values = getattr(getattr(span, "_attributes", None), "_dict", None)
    return values if type(values) is dict else span.attributes


def _count(tag: bytes, n: int) -> bytes:
    return tag + _varint(n) if n else b""


def _flags(context: SpanContext | None) -> bytes:
    return _FLAGS_REMOTE if context is not None and context.is_remote else _FLAGS_LOCAL


def _span(span: ReadableSpan) -> bytes:
    """A `Span` message, fields in number order as protobuf writes them."""
    context = span.context
    if context is None:
        raise _Unsupported("span without a context")
    parts = [
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + context.span_id.to_bytes(8, "big"),
    ]
    state = context.trace_state
    if state:
        parts.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in state.items()).encode()))
    parent = span.parent
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    name = span.name
    if name:
        encoded = _NAMES.get(name)
        if encoded is None:
            if len(_NAMES) >= _PAIRS_LIMIT:
                _NAMES.clear()
            encoded = _NAMES[name] = _field(b"\x2a", name.encode())
        parts.append(encoded)
    parts.append(_KINDS[span.kind])
    if span.start_time:
        parts.append(b"\x39" + _pack_fixed64(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _pack_fixed64(span.end_time))
    parts.append(_attributes(b"\x4a", _attribute_values(span)))
    parts.append(_count(b"\x50", span.dropped_attributes))
    for event in span.events:
        parts.append(_field(b"\x5a", _event(event)))
    parts.append(_count(b"\x60", span.dropped_events))
    for link in span.links:
        parts.append(_field(b"\x6a", _link(link)))
    parts.append(_count(b"\x70", span.dropped_links))
    status = span.status
    if status is not None:
        message = _field(b"\x12", status.description.encode()) if status.description else b""
        code = status.status_code.value
        parts.append(_field(b"\x7a", message + (b"\x18" + _varint(code) if code else b"")))
    parts.append(_flags(parent))
    return b"".join(parts)


def _event(event: Any) -> bytes:
    out = b"\x09" + _pack_fixed64(event.timestamp) if event.timestamp else b""
    if event.name:
        out += _field(b"\x12", event.name.encode())
    return out + _attributes(b"\x1a", event.attributes) + _count(b"\x20", event.dropped_attributes)


def _link(link: Any) -> bytes:
    context = link.context
    out = (
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big") + b"\x12\x08" + context.span_id.to_bytes(8, "big")
    )
    out += _attributes(b"\x22", link.attributes) + _count(b"\x28", link.dropped_attributes)
    return out + (_LINK_FLAGS_REMOTE if context.is_remote else _LINK_FLAGS_LOCAL)


class _Encoded:
    """Resources and scopes met so far, each encoded once; equal ones share one entry (the SDK
    groups spans by equality)."""

    def __init__(self) -> None:
        self._resources: dict[int, tuple[Resource, bytes]] = {}
        self._scopes: dict[int, tuple[InstrumentationScope | None, bytes]] = {}

    def resource(self, resource: Resource) -> tuple[Resource, bytes]:
        known = self._resources.get(id(resource))
        if known is None or known[0] is not resource:
            known = self._canon(self._resources, resource, _resource_fields)
        return known

    def scope(self, scope: InstrumentationScope | None) -> tuple[InstrumentationScope | None, bytes]:
        known = self._scopes.get(id(scope))
        if known is None or known[0] is not scope:
            known = self._canon(self._scopes, scope, _scope_fields)
        return known

    @staticmethod
    def _canon(table: dict[int, Any], item: Any, encode: Any) -> Any:
        if len(table) >= _CANON_LIMIT:
            raise _Unsupported("too many resources or scopes")
        for first, data in list(table.values()):
            if first == item:
                table[id(item)] = (first, data)
                return first, data
        table[id(item)] = entry = (item, encode(item))
        return entry


def _resource_fields(resource: Resource) -> bytes:
    """The `Resource` message (field 1 of `ResourceSpans`)."""
    return _encode_resource(resource).SerializeToString()


def _scope_fields(scope: InstrumentationScope | None) -> bytes:
    return _encode_instrumentation_scope(scope).SerializeToString()  # type: ignore[arg-type]


_ScopeGroup = tuple[InstrumentationScope | None, bytes, list[bytes]]
"""A scope, its encoded message, its spans' encoded fields."""


def encode_spans(spans: Sequence[ReadableSpan], encoded: _Encoded | None = None) -> bytes:
    """The serialized `ExportTraceServiceRequest` of `spans`, as the SDK's encoder writes it
    (raises `_Unsupported` for what only the SDK's encoder writes)."""
    encoded = encoded if encoded is not None else _Encoded()
    groups: dict[int, tuple[Resource, bytes, dict[int, _ScopeGroup]]] = {}
    for span in spans:
        resource, resource_data = encoded.resource(span.resource)
        scope, scope_data = encoded.scope(span.instrumentation_scope or None)
        group = groups.get(id(resource))
        if group is None:
            group = groups[id(resource)] = (resource, resource_data, {})
        scopes = group[2]
        entry = scopes.get(id(scope))
        if entry is None:
            entry = scopes[id(scope)] = (scope, scope_data, [])
        entry[2].append(_field(b"\x12", _span(span)))
    out = []
    for resource, resource_data, scopes in groups.values():
        body = [_field(b"\x0a", resource_data)]
        for scope, scope_data, span_fields in scopes.values():
            scope_url = scope.schema_url if scope is not None else None
            scope_body = _field(b"\x0a", scope_data) + b"".join(span_fields)
            if scope_url:
                scope_body += _field(b"\x1a", scope_url.encode())
            body.append(_field(b"\x12", scope_body))
        if resource.schema_url:
            body.append(_field(b"\x1a", resource.schema_url.encode()))
        out.append(_field(b"\x0a", b"".join(body)))
    return b"".join(out)


class FastOTLPSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP span exporter, its batches encoded by `encode_spans` (the SDK's own
    encoder for a batch that needs it). To a plain-HTTP receiver on this machine (the local Jaeger)
    it posts through the SDK's urllib3 transport instead of its `requests` one (a third of the CPU
    a request: no session, environment or netrc merging, which change nothing there), unless a
    proxy variable or a netrc file could have changed where or how `requests` sends."""

    def __init__(self, endpoint: str | None = None, **kwargs: Any) -> None:
        transport = _loopback_transport(endpoint, kwargs)
        if transport is not None:
            kwargs["_transport"] = transport
        super().__init__(endpoint, **kwargs)
        self._encoded = _Encoded()
        self._sends = all(
            hasattr(self, name) for name in ("_client", "_metrics", "_max_request_size", "_shutdown")
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = self._encode(spans) if self._sends and not self._shutdown else None
        limit = getattr(self, "_max_request_size", 0)
        if data is None or 0 < limit < len(data):  # the SDK's path: its own encoder, checks, logs
            return super().export(spans)
        with self._metrics.export_operation(len(spans)) as result:
            outcome = self._client.export(data)
            if not outcome.success:
                result.error = outcome.error
                code = outcome.status_code
                result.error_attrs = {"http.response.status_code": code} if code is not None else None
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _encode(self, spans: Sequence[ReadableSpan]) -> bytes | None:
        try:
            return encode_spans(spans, self._encoded)
        except Exception as exc:  # whatever it is, the SDK's encoder writes (or reports) it
            log.debug("span batch left to the SDK's encoder: %s", exc)
            return None


_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _loopback_transport(endpoint: str | None, options: Mapping[str, Any]) -> Any:
    """The SDK's urllib3 transport for `endpoint` when it is plain HTTP on this machine and the
    exporter is given no session, transport or certificates; else None (its `requests` transport)."""
    if endpoint is None or set(options) - {"headers", "timeout", "compression"}:
        return None
    url = urlsplit(endpoint)
    if url.scheme != "http" or url.hostname not in _LOOPBACK:
        return None
    if any(name.lower() in _PROXY_VARIABLES for name in os.environ) or os.environ.get("NETRC"):
        return None
    if os.path.exists(os.path.expanduser("~/.netrc")) or os.path.exists(os.path.expanduser("~/_netrc")):
        return None
    if any(os.environ.get(name) for name in _CREDENTIAL_PROVIDERS):
        return None
    try:
        from opentelemetry.exporter.http.transport._urllib3 import Urllib3HTTPTransport
    except ImportError:  # a release without it: the exporter's own
        return None
    return Urllib3HTTPTransport()


_CREDENTIAL_PROVIDERS = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
)
"""A `requests` session from a credential provider: the exporter's own transport."""
