"""A request-body size limit whose 413 is an OpenAI-shaped JSON error, like every other gateway error.

FastAPI's and Starlette's own limits answer 413 in plain text, which OpenAI clients cannot parse.
This ASGI middleware refuses a declared Content-Length over the limit at once, otherwise reads the
body (chunked or not) up to the limit and hands the app the whole of it; later `receive` calls go to
the server, so the app still learns when the client disconnects.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(send)
        chunks, size, message = [], 0, {"more_body": True}
        while message.get("more_body"):
            message = await receive()
            if message["type"] != "http.request":  # gone before the body arrived
                return await self.app(scope, _replay(message, receive), send)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._too_large(send)
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay(body, receive), send)

    async def _too_large(self, send: Send) -> None:
        error = {
            "message": f"the request body is over the gateway's limit of {self.max_bytes} bytes",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
        body = json.dumps({"error": error}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _replay(first: Message, receive: Receive) -> Receive:
    pending = [first]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed
