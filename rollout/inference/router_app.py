"""`RouterServer`: one URL in front of N inference servers (`stacx route`).

Speaks the servers' own API (SGLang's native routes plus the OpenAI ones), so a client cannot
tell it from one server. `/generate` and the OpenAI routes go where `PrefixRouter` says (token
ids, else the prompt's UTF-8 bytes, are the prefix). A server that cannot be reached is marked
down and the request is sent to the next one (a generation is safe to repeat: nothing was
returned); a 503 (a server starting, swapping weights or stopping) is retried elsewhere too. A
health probe brings a server back once its `/health` answers 200 again (the built-in server
answers so only once it serves the newest weights). `/get_model_info` reports the lowest
`weight_version` among the servers that are up (every server has at least it) and each server's
own; `/update_weights_from_disk` goes to every server that is up, like SGLang's router.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from stacx.rollout.inference.errors import ServerUnavailableError
from stacx.rollout.inference.router import PrefixRouter, RouterConfig

__all__ = ["ROUTED_PATHS", "RouterServer", "build_router_app", "prefix_ids"]

log = logging.getLogger(__name__)

ROUTED_PATHS = ("/generate", "/v1/chat/completions", "/v1/completions")
"""POST routes sent to one server chosen by prefix."""
RETRY_ELSEWHERE = frozenset({502, 503})


def prefix_ids(path: str, body: dict[str, Any]) -> list[int] | None:
    """What the router matches prefixes on: `input_ids` (the first row of a batch), else the
    UTF-8 bytes of the prompt text or of the chat messages; None when there is neither."""
    ids = body.get("input_ids")
    if isinstance(ids, list) and ids:
        first = ids[0]
        row = first if isinstance(first, list) else ids
        return [int(i) for i in row]
    text: Any = body.get("text") if path == "/generate" else body.get("prompt")
    if path == "/v1/chat/completions":
        text = json.dumps(body.get("messages"), sort_keys=True)
    if isinstance(text, list):
        text = text[0] if text else None
    return list(str(text).encode()) if text else None


class _Forwarder:
    """Sends requests to the servers the router picks, failing over on the way."""

    def __init__(self, router: PrefixRouter, http: httpx.AsyncClient) -> None:
        self.router = router
        self.http = http

    async def routed(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Response:
        ids = prefix_ids(path, body)
        tried: list[str] = []
        last: Response | None = None
        while True:
            try:
                url = self.router.choose(ids, time.monotonic(), exclude=tried)
            except ServerUnavailableError as exc:
                return last or _error(503, str(exc))
            if tried:
                self.router.failed_over()
            tried.append(url)
            if body.get("stream"):
                return await self._stream(url, path, body, headers)
            try:
                answer = await self._post(url, path, body, headers)
            except httpx.TransportError as exc:
                log.warning("router: %s failed (%r): marked down, trying another server", url, exc)
                self.router.mark_down(url)
                continue
            if answer.status_code in RETRY_ELSEWHERE:
                last = answer
                continue
            return answer

    async def _post(self, url: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> Response:
        self.router.started(url)
        try:
            answer = await self.http.post(f"{url}{path}", json=body, headers=headers)
        finally:
            self.router.finished(url)
        return Response(answer.content, status_code=answer.status_code,
                        media_type=answer.headers.get("content-type"))

    async def _stream(self, url: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> Response:
        """A stream is passed through as it comes (no failover once it has started)."""
        self.router.started(url)
        try:
            request = self.http.build_request("POST", f"{url}{path}", json=body, headers=headers)
            upstream = await self.http.send(request, stream=True)
        except httpx.TransportError as exc:
            self.router.finished(url)
            self.router.mark_down(url)
            return _error(503, f"router: {url} failed ({exc!r}); retry")

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                self.router.finished(url)

        return StreamingResponse(chunks(), status_code=upstream.status_code,
                                 media_type=upstream.headers.get("content-type"))

    async def model_info(self) -> Response:
        infos: dict[str, dict[str, Any]] = {}
        for url in [u for u in self.router.upstreams if self.router.up[u]]:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                answer = await self.http.get(f"{url}/get_model_info", timeout=5.0)
                if answer.is_success:
                    infos[url] = answer.json()
        if not infos:
            return _error(503, "router: no inference server is up")
        versions = [str(info.get("weight_version", "")) for info in infos.values()]
        lowest = min(versions, key=lambda v: (int(v), v) if v.lstrip("-").isdigit() else (1 << 62, v))
        first = next(iter(infos.values()))
        servers = {url: str(info.get("weight_version", "")) for url, info in infos.items()}
        return JSONResponse({**first, "weight_version": lowest, "servers": servers})

    async def to_every_server(self, path: str, body: dict[str, Any]) -> Response:
        results = []
        for url in [u for u in self.router.upstreams if self.router.up[u]]:
            try:
                answer = await self.http.post(f"{url}{path}", json=body)
                results.append({"url": url, "status": answer.status_code, **_json(answer)})
            except httpx.TransportError as exc:
                results.append({"url": url, "success": False, "message": repr(exc)})
        success = bool(results) and all(r.get("success", False) for r in results)
        first = results[0] if results else {}
        return JSONResponse({**{k: v for k, v in first.items() if k != "url"}, "success": success,
                             "servers": results}, status_code=200 if success else 400)

    async def probe(self) -> None:
        """Ask every server's /health once; mark each up or down by its answer."""
        for url in self.router.upstreams:
            try:
                healthy = (await self.http.get(f"{url}/health", timeout=2.0)).status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy and not self.router.up[url]:
                log.info("router: %s is up", url)
                self.router.mark_up(url)
            elif not healthy and self.router.up[url]:
                log.warning("router: %s does not answer /health: marked down", url)
                self.router.mark_down(url)


def _json(answer: httpx.Response) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        return {"message": answer.text[:300]}
    return body if isinstance(body, dict) else {"body": body}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "router", "code": status}}, status_code=status)


def _forwarded_headers(request: Request) -> dict[str, str]:
    """Trace context and auth go on to the server; hop-by-hop headers do not."""
    keep = ("traceparent", "tracestate", "authorization")
    return {k: v for k, v in request.headers.items() if k.lower() in keep}


def build_router_app(config: RouterConfig, transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The router's FastAPI app (its probe loop runs while the app does)."""
    router = PrefixRouter(config)
    state: dict[str, _Forwarder] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(timeout=config.timeout_s, transport=transport) as http:
            state["forwarder"] = forwarder = _Forwarder(router, http)
            await forwarder.probe()
            task = asyncio.create_task(_probe_loop(forwarder, config.probe_interval_s))
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    app = FastAPI(lifespan=lifespan)
    app.state.router = router

    async def routed(request: Request) -> Response:
        try:
            body = await request.json()
        except ClientDisconnect:  # the caller went away (a rollout being stopped): nothing to route
            return Response(status_code=499)
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        return await state["forwarder"].routed(request.url.path, body, _forwarded_headers(request))

    for path in ROUTED_PATHS:
        app.add_api_route(path, routed, methods=["POST"])

    @app.get("/health")
    async def health() -> Response:
        up = [u for u in router.upstreams if router.up[u]]
        return JSONResponse({"up": len(up), "servers": len(router.upstreams)}, status_code=200 if up else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        body = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        answer = await state["forwarder"].routed("/generate", body, {})
        return Response(status_code=200 if answer.status_code == 200 else 503)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> Response:
        return await state["forwarder"].model_info()

    @app.post("/update_weights_from_disk")
    async def update_weights(request: Request) -> Response:
        return await state["forwarder"].to_every_server("/update_weights_from_disk", await request.json())

    @app.get("/workers")
    async def workers() -> Response:
        return JSONResponse({
            "failovers": router.num_failovers,
            "servers": [
                {"url": u, "up": router.up[u], "in_flight": router.in_flight[u],
                 "routed": router.routed[u], "tree_blocks": router.tree_blocks(u)}
                for u in router.upstreams
            ],
        })

    return app


async def _probe_loop(forwarder: _Forwarder, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        await forwarder.probe()


class RouterServer:
    """Runs the router app with uvicorn until SIGINT/SIGTERM."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.app = build_router_app(config)

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def serve_forever(self) -> None:
        server = uvicorn.Server(uvicorn.Config(
            self.app, host=self.config.host, port=self.config.port, log_level="warning",
            access_log=False, lifespan="on",
        ))
        log.info("routing %s over %s", self.base_url, ", ".join(self.config.upstreams))
        asyncio.run(server.serve())
        log.info("router stopped")
