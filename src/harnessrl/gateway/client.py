"""Clients of the gateway, over real HTTP or in process (httpx's ASGI transport, no sockets).

`GatewayClient` is the admin side (create, read, finish, delete episodes); `.openai(api_key)` gives
the `openai.AsyncOpenAI` an agent uses, bound to one episode by its key. Both transports behave
identically because both go through the same ASGI app.
"""

from __future__ import annotations

import importlib

import openai

from harnessrl.types import Episode, Outcome, Task

# openai >= 3 is built on httpx2, earlier releases on httpx: use whichever its client subclasses
_http = importlib.import_module(openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])
IN_PROCESS_URL = "http://harnessrl.local"


class GatewayError(RuntimeError):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status  # the HTTP status the gateway answered


class GatewayClient:
    def __init__(self, admin_key: str, base_url: str | None = None, app=None, timeout: float = 600.0):
        """Give `base_url` (e.g. http://127.0.0.1:8000) for HTTP, or `app` for the in-process transport."""
        if (base_url is None) == (app is None):
            raise ValueError("give exactly one of base_url (HTTP) or app (in process)")
        self.admin_key = admin_key
        self.base_url = (base_url or IN_PROCESS_URL).rstrip("/")
        self._transport = _http.ASGITransport(app=app) if app is not None else None
        self._timeout = timeout
        self._http = self._client(admin_key)
        self._agent_http = None  # shared by every episode's OpenAI client (one pool, one TLS setup)

    def _client(self, key: str):
        return _http.AsyncClient(
            base_url=self.base_url,
            transport=self._transport,
            timeout=self._timeout,
            headers={"Authorization": f"Bearer {key}"},
        )

    def openai(self, api_key: str) -> openai.AsyncOpenAI:
        """An OpenAI client whose chat calls are recorded into the episode that owns `api_key`.

        Clients share one connection pool, closed by `aclose()`; there is no need to close them.
        """
        if self._agent_http is None:
            self._agent_http = openai.DefaultAsyncHttpxClient(transport=self._transport, timeout=self._timeout)
        return openai.AsyncOpenAI(
            api_key=api_key, base_url=self.base_url + "/v1", http_client=self._agent_http, max_retries=0
        )

    async def create_episode(
        self, task: Task | None = None, agent: str = "main", trainable: bool = True
    ) -> tuple[str, str]:
        """Returns (episode id, episode API key)."""
        body = {"task": (task or Task()).model_dump(mode="json"), "agent": agent, "trainable": trainable}
        data = await self._request("POST", "/v1/episodes", json=body)
        return data["id"], data["api_key"]

    async def episode(self, episode_id: str) -> Episode:
        return Episode.model_validate(await self._request("GET", f"/v1/episodes/{episode_id}"))

    async def finish(
        self, episode_id: str, outcome: Outcome | None = None, failure_reason: str | None = None
    ) -> Episode:
        body = {
            "outcome": (outcome or Outcome()).model_dump(mode="json"),
            "status": "failed" if failure_reason else "finished",
            "failure_reason": failure_reason,
        }
        return Episode.model_validate(await self._request("POST", f"/v1/episodes/{episode_id}/finish", json=body))

    async def feedback(
        self, episode_id: str, signal: str, value: float | None = None, call: int | str | None = None
    ) -> dict:
        """A user's signal for a call of the episode (the last one by default); needs a server with a store."""
        body = {"signal": signal, "value": value, "call": call}
        return await self._request("POST", f"/v1/episodes/{episode_id}/feedback", json=body)

    async def delete(self, episode_id: str) -> None:
        await self._request("DELETE", f"/v1/episodes/{episode_id}")

    async def _request(self, method: str, path: str, **kwargs) -> dict:
        try:
            response = await self._http.request(method, path, **kwargs)
        except _http.TransportError as exc:  # no server there, a refused or dropped connection: say where
            raise GatewayError(f"{method} {self.base_url}{path}: {type(exc).__name__}: {exc or 'no answer'}") from exc
        if response.status_code >= 400:
            raise GatewayError(f"{method} {path}: {response.status_code} {response.text}", response.status_code)
        return response.json()

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._agent_http is not None:
            await self._agent_http.aclose()
