"""The OpenAI-compatible gateway: chat completions recorded token-exactly into episodes.

Routes: POST /v1/chat/completions, GET /v1/models[/{id}], GET /health, and the admin side of episodes:
POST /v1/episodes, GET /v1/episodes, GET|DELETE /v1/episodes/{id}, POST /v1/episodes/{id}/finish.
Every route but /health needs `Authorization: Bearer KEY`: the admin key, or an episode's own key
(which reaches only its own episode). Errors are OpenAI-shaped and name the offending field.

Several models, one call tree: a request whose `model` names a frozen model (`gateway/models.py`)
goes to it and is recorded untrainable; anything else goes to the trainable policy. A request's
`metadata` places the call in the episode's tree: `agent`, `lineage` (one conversation; default
the agent) and `parent` (the `id` of this episode's chat completion whose tool call spawned it).

Production (`harnessrl serve --registry`): with a `recorder` (a durable trace store) every episode,
call and finish is committed before the response returns (a write it refuses is a 503, and what it
refused is in memory neither), `POST /v1/episodes/{id}/feedback` records a user's signal for a call,
and sessions idle for `session_ttl` seconds are expired (failed, counted; their keys get 409).
The served policy can be swapped while requests run (`app.state.serving`, gateway/serving.py).

The gateway knows the policy and episodes; it knows nothing about rewards or training.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx
from fastapi import Body, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from harnessrl.gateway.bodylimit import BodyLimit
from harnessrl.gateway.episodes import EpisodeRecord, EpisodeStore
from harnessrl.gateway.models import Frozen, Proxied
from harnessrl.gateway.prompts import TEMPLATE_ERRORS, PromptError, Turn, build_prompt
from harnessrl.gateway.schema import (
    ChatRequest,
    Demonstration,
    EpisodeCreate,
    EpisodeFinish,
    FeedbackBody,
    FunctionCall,
    InputError,
    Message,
    NamedToolChoice,
    ToolCall,
)
from harnessrl.gateway.serving import DELETED, EXPIRED, Recorder, RecordError, Serving
from harnessrl.gateway.toolcalls import parse_tool_calls
from harnessrl.policy import Completion, Policy, SamplingParams
from harnessrl.policy.engine import NotEmbedded
from harnessrl.policy.vllm import Refused
from harnessrl.types import Call, input_path

log = logging.getLogger("harnessrl.gateway")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@dataclass
class Caller:
    admin: bool
    record: EpisodeRecord | None  # the episode an episode key belongs to


def create_app(
    policy: Policy,
    admin_key: str,
    max_request_bytes: int = 4 * 1024 * 1024,
    default_max_tokens: int = 512,
    finish_wait_seconds: float = 60.0,
    frozen: dict[str, Frozen] | None = None,
    recorder: Recorder | None = None,
    session_ttl: float | None = None,
    background: Sequence[Callable[[FastAPI], Awaitable[None]]] = (),
) -> FastAPI:
    if len(admin_key) < 8:
        raise ValueError("the admin key must be at least 8 characters")
    for name, value in (("max_request_bytes", max_request_bytes), ("default_max_tokens", default_max_tokens)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, not {value}")
    frozen = dict(frozen or {})
    if policy.name in frozen:
        raise ValueError(f"frozen model {policy.name!r} has the trainable policy's name")
    store, serving = EpisodeStore(), Serving(policy)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        tasks = [asyncio.create_task(work(app)) for work in background]  # e.g. following a model registry
        if session_ttl:
            tasks.append(asyncio.create_task(_expire_sessions(store, recorder, session_ttl)))
        for task in tasks:  # one that dies says so, not silently
            task.add_done_callback(_report_death)
        yield
        for task in tasks:
            task.cancel()

    app = FastAPI(title="harnessrl gateway", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)  # a JSON 413 (FastAPI's own is plain text)
    app.state.store, app.state.serving, app.state.frozen, app.state.recorder = store, serving, frozen, recorder

    async def durably(write: Callable[[], object], what: str) -> object:
        """Commit to the recorder (when there is one) before the response that acknowledges it; returns what the write
        returned. A refused write is a 503 naming `what` was not recorded; the store's own message (its SQL among it)
        goes to the log. A RecordError (the request itself refused) is the caller's to answer."""
        if recorder is None:
            return None
        try:
            return await asyncio.to_thread(write)
        except RecordError:  # the request itself refused (an unknown call, an episode ended): no retry helps
            raise
        except Exception as exc:  # the recorder's errors are its own (SQLAlchemy's, OSError, ...)
            log.error("the trace store refused to record %s: %s: %s", what, type(exc).__name__, exc)
            message = f"the trace store refused the write: {what} was not recorded; send it again"
            raise APIError(503, message, code="store_unavailable") from None

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(InputError)
    async def _bad_input(_: Request, exc: InputError) -> JSONResponse:
        return _error_response(400, str(exc), exc.param, "invalid_value")

    @app.exception_handler(PromptError)
    async def _unrenderable(_: Request, exc: PromptError) -> JSONResponse:
        return _error_response(400, f"messages: {exc}", "messages", "template_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        cause = exc.__cause__  # FastAPI's "error parsing the body": what json.loads raised beside a syntax error
        if exc.status_code == 400 and isinstance(cause, (ValueError, RecursionError)):
            why = "nested too deeply" if isinstance(cause, RecursionError) else f"{type(cause).__name__}: {cause}"
            return _error_response(400, f"body is not valid JSON: {why}", None, "json_invalid")
        return _error_response(exc.status_code, str(exc.detail), None, None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        kind = request.headers.get("content-type", "")
        media = kind.split(";")[0].strip().lower()  # FastAPI parses application/json and application/*+json only
        json_kind = media == "application/json" or (media.startswith("application/") and media.endswith("+json"))
        if tuple(first["loc"]) == ("body",) and not json_kind:
            message = f"body: send it as JSON with Content-Type: application/json (this one's: {kind or 'none'})"
            return _error_response(400, message, None, "content_type")
        if first["type"] == "json_invalid":
            return _error_response(400, f"body is not valid JSON: {first['msg']}", None, "json_invalid")
        first, path = _located(exc.errors(), exc.body)
        param = ".".join(map(str, path)) or None
        return _error_response(400, f"{param or 'body'}: {first['msg']}", param, first["type"])

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return _error_response(500, f"{type(exc).__name__}: {exc}", None, "internal_error")

    async def caller(request: Request) -> Caller:
        header = request.headers.get("authorization", "")
        if not header.lower().startswith("bearer "):
            raise APIError(401, "missing API key: send Authorization: Bearer KEY", code="invalid_api_key")
        key = header[7:].strip()
        if secrets.compare_digest(key.encode(), admin_key.encode()):
            return Caller(True, None)
        record = store.by_key(key)
        if record is None and (ended := store.ended_by_key(key)) is not None:  # left memory for the trace store
            message = f"episode {ended[0]} is {ended[1]} and no longer takes calls; create a new one"
            raise APIError(409, message, code="episode_finished")
        if record is None:
            raise APIError(401, "invalid API key", code="invalid_api_key")
        return Caller(False, record)

    async def admin(who: Caller = Depends(caller)) -> Caller:
        if not who.admin:
            raise APIError(403, "this route needs the admin key", code="forbidden")
        return who

    async def episode_of(episode_id: str, who: Caller = Depends(caller)) -> EpisodeRecord:
        if not who.admin and who.record.episode.id != episode_id:
            raise APIError(403, "an episode key reaches only its own episode", code="forbidden")
        record = store.get(episode_id)
        if record is None:
            raise APIError(404, f"no episode {episode_id!r}", param="id", code="not_found")
        return record

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": serving.policy.name, "policy_version": serving.policy.version}

    def served_models() -> list[dict]:
        served = [(serving.policy.name, "harnessrl"), *((name, "harnessrl-frozen") for name in frozen)]
        return [{"id": name, "object": "model", "created": 0, "owned_by": owner} for name, owner in served]

    @app.get("/v1/models")
    async def models(_: Caller = Depends(caller)) -> dict:
        return {"object": "list", "data": served_models()}

    @app.get("/v1/models/{model_id:path}")  # a path: model names such as Qwen/Qwen3-8B hold slashes
    async def model(model_id: str, _: Caller = Depends(caller)) -> dict:
        served = served_models()
        for entry in served:
            if entry["id"] == model_id:
                return entry
        names = ", ".join(repr(entry["id"]) for entry in served)
        raise APIError(
            404, f"no model {model_id!r}: this gateway serves {names}", param="model", code="model_not_found"
        )

    @app.post("/v1/episodes")
    async def create_episode(body: EpisodeCreate | None = Body(default=None), _: Caller = Depends(admin)) -> dict:
        body = body or EpisodeCreate()
        record = store.create(body.task, body.agent, body.trainable)
        policy = serving.policy
        try:
            await durably(lambda: recorder.add_episode(record.episode, policy.name, policy.version), "the episode")
        except APIError:
            store.delete(record.episode.id)  # not stored, so not served: its calls would be recorded nowhere
            raise
        return {"id": record.episode.id, "api_key": record.api_key}

    @app.get("/v1/episodes")
    async def list_episodes(_: Caller = Depends(admin)) -> dict:
        return {"data": [{"id": i, "status": store.get(i).episode.status} for i in store.ids()]}

    @app.get("/v1/episodes/{episode_id}")
    async def get_episode(episode_id: str, who: Caller = Depends(caller)) -> Response:
        if who.admin and store.get(episode_id) is None and recorder is not None:  # expired from memory
            try:
                stored = await asyncio.to_thread(recorder.get, episode_id)
            except Exception as exc:  # the recorder's errors are its own (SQLAlchemy's, OSError, ...), as in `durably`
                log.error("the trace store could not read episode %r: %s: %s", episode_id, type(exc).__name__, exc)
                message = "the trace store could not be read; try again"
                raise APIError(503, message, code="store_unavailable") from None
            if stored is not None:
                return await _episode_response(stored)
        return await _episode_response((await episode_of(episode_id, who)).episode)

    @app.post("/v1/episodes/{episode_id}/feedback")
    async def feedback(episode_id: str, body: FeedbackBody, who: Caller = Depends(caller)) -> dict:
        """A user's signal for one call, joined late (after finish, after expiry) and idempotently."""
        if not who.admin and who.record.episode.id != episode_id:
            raise APIError(403, "an episode key reaches only its own episode", code="forbidden")
        if recorder is None:
            raise APIError(409, "feedback needs a trace store: serve with --store or --registry", code="no_store")
        try:
            index = await durably(
                lambda: recorder.add_feedback(episode_id, body.call, body.signal, body.value), "the feedback"
            )
        except RecordError as exc:  # unknown episode or call
            raise APIError(404, str(exc), param=exc.param, code="not_found") from None
        return {"episode": episode_id, "call": index, "signal": body.signal, "value": body.value}

    @app.delete("/v1/episodes/{episode_id}")
    async def delete_episode(episode_id: str, _: Caller = Depends(admin)) -> dict:
        if (record := store.get(episode_id)) is None:
            raise APIError(404, f"no episode {episode_id!r}", param="id", code="not_found")
        async with record.appending:  # ended first, so a call still generating answers 409 and is not recorded
            if record.episode.status == "running":  # a trace store keeps it: ended there, not running forever
                deleted = record.episode.model_copy(update={"status": "failed", "failure_reason": DELETED})
                with contextlib.suppress(RecordError):  # the store ended it first (a cycle expired it): that end stands
                    await durably(lambda: recorder.finish(deleted), "the deletion")
                record.episode = deleted
        store.forget(episode_id, "deleted")  # a late call with its key hears 409, not 401 "invalid API key"
        return {"id": episode_id, "deleted": True}

    @app.post("/v1/episodes/{episode_id}/finish")
    async def finish_episode(body: EpisodeFinish, record: EpisodeRecord = Depends(episode_of)) -> Response:
        if record.episode.status != "running":
            raise APIError(409, f"episode is already {record.episode.status}", code="episode_finished")
        deadline = time.monotonic() + finish_wait_seconds
        while record.in_flight and time.monotonic() < deadline:  # let calls still generating land first
            await asyncio.sleep(0.01)
        async with record.appending:  # no call is between its append and its commit while the copy is made
            if record.episode.status != "running":  # finished by a concurrent request meanwhile
                raise APIError(409, f"episode is already {record.episode.status}", code="episode_finished")
            record.finishing = True  # a call that ends from here on finds the episode closed (409, not recorded)
            try:
                # atomic: the finished episode is built, serialised and stored first, then replaces the running one;
                # it gets its own list of calls (a shallow copy would share the running one's)
                update = {"outcome": body.outcome, "status": body.status, "failure_reason": body.failure_reason}
                finished = record.episode.model_copy(update={**update, "calls": list(record.episode.calls)})
                line = await asyncio.to_thread(finished.model_dump_json)
                try:
                    await durably(lambda: recorder.finish(finished), "the finish")
                except RecordError as exc:  # the store ended it first (a cycle expired it): that end stands
                    store.forget(record.episode.id, "ended in the trace store")
                    raise APIError(409, str(exc), param=exc.param, code="episode_finished") from None
                record.episode, record.touched = finished, time.monotonic()
            finally:
                record.finishing = False
        return Response(line, media_type="application/json")

    @app.post("/v1/demonstrations")
    async def demonstrate(body: Demonstration, who: Caller = Depends(caller)) -> dict:
        """Record an expert's chosen reply as if the policy had sampled it (logprobs 0): SFT data
        built with exactly the prompts, template and token reuse of real rollouts."""
        record = who.record
        if record is None:
            raise APIError(400, "demonstrations are recorded into an episode: use its key", code="episode_key_required")
        _check_open(record)
        record.in_flight += 1  # before any await, as a chat call: `finish` waits for it, expiry spares its episode
        try:
            with serving.use() as policy:
                return await demonstrated(policy, body, record)
        finally:
            record.in_flight -= 1

    async def demonstrated(policy: Policy, body: Demonstration, record: EpisodeRecord) -> dict:
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        thread = (record.agent, None)
        prompt = await asyncio.to_thread(
            build_prompt, policy, body.messages, tools, record.episode.calls, record.turns, thread
        )
        completion = await asyncio.to_thread(_rendered_reply, policy, prompt.text, body.messages, body.reply, tools)
        if len(prompt.ids) + len(completion) > policy.context:  # as a sampled call ends: at the context's end
            raise APIError(
                400,
                f"reply: the prompt ({len(prompt.ids)} tokens) and the reply ({len(completion)}) do not fit the "
                f"model's context of {policy.context}",
                param="reply",
                code="context_length_exceeded",
            )
        response_id = "chatcmpl-" + secrets.token_hex(12)  # what a sub-agent it spawns names as its parent
        async with _appending(record):
            index = len(record.episode.calls)
            record.responses[response_id] = range(index, index + 1)
            record.episode.calls.append(Call(
                agent=record.agent, prompt_ids=prompt.ids, completion_ids=completion, sampled_logprobs=[0.0] * len(completion),
                policy_version=policy.version, trainable=record.trainable, extends_call=prompt.extends_call,
                finish_reason="tool_calls" if body.reply.tool_calls else "stop", demonstration=True,
            ))  # fmt: skip
            record.turns.append(Turn(prompt.identities, prompt.tools_key, prompt.text, body.reply.identity(), thread))
            await persist(record, index, response_id, None)
        return {
            "id": response_id,
            "call": index,
            "prompt_tokens": len(prompt.ids),
            "completion_tokens": len(completion),
        }

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request, who: Caller = Depends(caller)) -> Response:
        record = who.record
        if record is None:
            return await chat_call(body, request, None)
        _check_open(record)
        # counted before any await: `finish` waits for this call (up to finish_wait_seconds) and the session
        # expiry spares its episode, from the check above to the call's commit
        record.in_flight += 1
        try:
            return await chat_call(body, request, record)
        finally:
            record.in_flight -= 1

    async def chat_call(body: ChatRequest, request: Request, record: EpisodeRecord | None) -> Response:
        place = _place(body, record)
        try:
            return await placed_call(body, request, record, place)
        finally:
            if record is not None:  # a request that recorded nothing leaves its lineage's parent unclaimed
                record.release(place.thread[0])

    async def placed_call(body: ChatRequest, request: Request, record: EpisodeRecord | None, place: Place) -> Response:
        served = frozen.get(body.model or "")
        if isinstance(served, Proxied):
            response, response_id, calls = await _proxied(request, served, body, place)
            if record is not None and calls:
                async with _appending(record):
                    first = len(record.episode.calls)
                    record.responses[response_id] = range(first, first + len(calls))
                    record.episode.calls.extend(calls)
                    record.turns.extend(Turn([], "", "", (), place.thread) for _ in calls)  # none a later call extends
                    await persist(record, first, response_id, None)
            return response
        with serving.use() as policy:  # this request finishes on the policy it started on, whatever is promoted
            return await complete(policy, served, place, body, request, record)

    async def persist(record: EpisodeRecord, first: int, response_id: str | None, reflagged: int | None) -> None:
        """Commit the calls from `first` on (and a held choice the agent went on from) before answering; called
        under `_appending`. Calls the store refuses are taken back out of memory, so memory and store agree and
        the client's error (503) is for a call recorded nowhere: sending it again is safe."""
        calls = record.episode.calls
        rows = [(i, calls[i], response_id) for i in range(first, len(calls))]
        rows += [(reflagged, calls[reflagged], None)] if reflagged is not None else []
        record.touched = time.monotonic()
        try:
            await durably(lambda: recorder.add_calls(record.episode.id, rows), "the call")
        except APIError:
            record.take_back(first, reflagged)
            raise

    async def complete(policy: Policy, served, place: Place, body: ChatRequest, request: Request, record) -> Response:
        model = policy if served is None else served.policy
        if served is not None:
            place.model, place.trainable = body.model, False
        tools = body.tool_specs()
        calls, turns = (record.episode.calls, record.turns) if record else ([], [])
        # tokenising and rendering a long request takes seconds: never on the event loop
        prompt = await asyncio.to_thread(build_prompt, model, body.messages, tools, calls, turns, place.thread)
        forced = _forced_prefix(model, body)
        prompt_ids = prompt.ids + model.encode(forced) if forced else prompt.ids
        room = model.context - len(prompt_ids)
        if room < 1:
            raise APIError(
                400,
                f"messages: the prompt has {len(prompt_ids)} tokens; the model's context is {model.context}",
                param="messages",
                code="context_length_exceeded",
            )
        params = SamplingParams(
            temperature=body.temperature,
            top_p=body.top_p,
            max_tokens=min(body.max_completion_tokens or body.max_tokens or default_max_tokens, room),
            stop=body.stops(),
            seed=body.seed,
            ignore_eos=body.ignore_eos,
        )
        started = time.time()
        # a pinned frozen model may answer from its cache of greedy completions
        generation = (served or model.engine).generate(prompt_ids, params, body.n)
        try:
            completions = await _unless_disconnected(request, generation)
        except NotEmbedded as exc:  # an added token past the rows (a [PAD] added without resizing)
            token = model.tokenizer.convert_ids_to_tokens(exc.token)
            raise APIError(
                400, f"messages: the prompt holds token {token!r}: {exc}", "messages", "invalid_prompt"
            ) from None
        except Refused as exc:  # --vllm-url: its 400 is this request's (a prompt id past its vocabulary), else its own
            log.warning("%s", exc)  # the server's URL for the operator; the agent hears vLLM's reason only
            if exc.status == 400:
                raise APIError(400, f"messages: the model server refused the prompt: {exc.reason}", "messages",
                               "invalid_prompt") from None  # fmt: skip
            raise APIError(502, f"the model server failed: {exc.reason}", None, "upstream_error") from None
        if completions is None:  # the client went away: its rows are freed, nothing is recorded
            return Response(status_code=499)
        answers = [_assistant_message(model, completion, forced, body) for completion in completions]
        # the body first: a call is committed only once the answer that returns it is built
        choices = [
            _choice(model, index, message, finish, completion if body.logprobs else None)
            for index, (completion, (message, finish, _)) in enumerate(zip(completions, answers))
        ]
        response_id = "chatcmpl-" + secrets.token_hex(12)
        if record is not None:
            async with _appending(record):
                reflagged = None
                if prompt.extends_call in record.held_choices:  # the agent kept this choice of n
                    reflagged = prompt.extends_call
                    record.episode.calls[reflagged].trainable = record.held_choices.pop(reflagged)
                first = len(record.episode.calls)
                record.responses[response_id] = range(first, first + len(completions))
                for completion, (message, finish, error) in zip(completions, answers):
                    if body.n > 1:  # siblings must not share the episode's advantage unless the agent goes on from one
                        record.held_choices[len(record.episode.calls)] = place.trainable
                    record.episode.calls.append(Call(
                        agent=place.agent, model=place.model, lineage=place.lineage, parent_call=place.parent_call,
                        prompt_ids=prompt_ids, completion_ids=completion.ids,
                        sampled_logprobs=completion.logprobs, policy_version=completion.policy_version,
                        trainable=place.trainable and body.n == 1, finish_reason=finish,
                        extends_call=prompt.extends_call, tool_call_error=error, started_at=started,
                        ended_at=time.time(), temperature=params.temperature, top_p=params.top_p,
                    ))  # fmt: skip
                    record.turns.append(
                        Turn(prompt.identities, prompt.tools_key, prompt.text, message.identity(), place.thread)
                    )
                await persist(record, first, response_id, reflagged)
        completion_tokens = sum(len(c.ids) for c in completions)
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens,
        }
        cached = [c.cached_tokens for c in completions if c.cached_tokens is not None]
        if cached:  # OpenAI's field: the prompt tokens whose KV was reused (the engine's prefix cache)
            usage["prompt_tokens_details"] = {"cached_tokens": max(cached)}
        return JSONResponse({
            "id": response_id,
            "object": "chat.completion",
            "created": int(started),
            "model": place.model or policy.name,
            "system_fingerprint": f"policy-v{completions[0].policy_version}",
            "choices": choices,
            "usage": usage,
        })  # fmt: skip

    return app


def _rendered_reply(
    policy: Policy, head: str, messages: list[Message], reply: Message, tools: list[dict] | None
) -> list[int]:
    """The ids of an assistant turn as the chat template renders it, through its end-of-turn token."""
    # the turn ends at its first end-of-turn token, which need not be the tokenizer's eos_token: a ChatML base
    # model whose eos is <|endoftext|> (Qwen2.5's) ends its turns with <|im_end|>
    tokens = sorted({policy.decode([i]) for i in policy.eos_ids} - {""})
    texts = [("reply.content", reply.text())] + [
        (f"reply.tool_calls.{n}.function.{key}", getattr(call.function, key))
        for n, call in enumerate(reply.tool_calls or ())
        for key in ("name", "arguments")
    ]
    for field, text in texts:  # tokenized as that token (as vLLM does), it would end the turn there: the rest lost
        if held := [token for token in tokens if token in text]:
            raise APIError(
                400,
                f"{field}: holds {held[0]!r}, the model's end-of-turn token: the recorded turn would end there",
                param=field,
            )
    try:
        full = policy.render(
            [m.for_template() for m in messages] + [reply.for_template()], tools, generation_prompt=False
        )
    except TEMPLATE_ERRORS as exc:
        raise PromptError(f"the chat template cannot render the reply: {type(exc).__name__}: {exc}") from None
    ends = [(at, len(token)) for token in tokens if (at := full.find(token, len(head))) >= 0]
    if not full.startswith(head) or not ends:
        raise APIError(400, "reply: the chat template does not render it after the conversation", param="reply")
    at, length = min(ends)
    return policy.encode(full[len(head) : at + length])


def _forced_prefix(policy: Policy, body: ChatRequest) -> str:
    """What goes in the prompt after the generation prompt so that the reply is a call (to the named
    tool): never sampled, so never trained on."""
    if isinstance(body.tool_choice, NamedToolChoice):
        return policy.call_prefix(body.tool_choice.function["name"])
    return policy.call_prefix() if body.tool_choice == "required" else ""


@dataclass
class Place:
    """Where a call sits in its episode: agent, conversation, spawning call, and who serves it."""

    agent: str
    trainable: bool
    lineage: str | None = None
    parent_call: int | None = None
    model: str | None = None  # a frozen model's name; None for the trainable policy

    @property
    def thread(self) -> tuple[str, str | None]:
        """What a call may extend: only earlier calls of the same conversation on the same model."""
        return (self.lineage or self.agent, self.model)


def _place(body: ChatRequest, record: EpisodeRecord | None) -> Place:
    """The call's place from `metadata`: agent, lineage, trainable, parent and parent_choice (other keys are the
    agent's own, as OpenAI allows, and ignored)."""
    meta = body.metadata or {}
    place = Place(meta.get("agent") or (record.agent if record else "main"), record.trainable if record else True)
    place.lineage = meta.get("lineage") or None
    if "trainable" in meta:
        if meta["trainable"] not in ("true", "false"):
            raise APIError(400, "metadata.trainable must be 'true' or 'false'", param="metadata.trainable")
        place.trainable = meta["trainable"] == "true"
    if "parent" in meta:
        if record is None or meta["parent"] not in record.responses:
            raise APIError(
                400, "metadata.parent: not the id of a chat completion of this episode", param="metadata.parent"
            )
        calls = record.responses[meta["parent"]]  # one a choice: `parent_choice` names which spawned this call
        choice = meta.get("parent_choice", "0")
        if not (choice.isascii() and choice.isdigit() and int(choice) < len(calls)):
            raise APIError(
                400,
                f"metadata.parent_choice: {choice[:20]!r} is not a choice of {meta['parent']} (0..{len(calls) - 1})",
                param="metadata.parent_choice",
            )
        place.parent_call = calls[int(choice)]
    elif "parent_choice" in meta:
        raise APIError(400, "metadata.parent_choice: names a choice of metadata.parent, which is missing",
                       param="metadata.parent_choice")  # fmt: skip
    if record is not None:  # a conversation keeps the parent it began with (calltree checks this)
        name = place.lineage or place.agent
        began = record.claim(name, place.parent_call)  # the request releases it when it ends (chat_call)
        if began != place.parent_call:
            raise APIError(
                400,
                f"metadata.parent: lineage {name!r} was spawned by call {began}, not {place.parent_call}",
                param="metadata.parent",
            )
    return place


async def _proxied(
    request: Request, served: Proxied, body: ChatRequest, place: Place
) -> tuple[Response, str | None, list[Call]]:
    """Forward to a frozen model's own endpoint: the response, its id, and the calls to record (with the ids
    the server sends, when it does; none when it failed or the client went away)."""
    payload = body.model_dump(mode="json", exclude_unset=True, exclude={"metadata"})
    payload.update(served.extra_body, model=served.model)
    headers = {"Authorization": f"Bearer {served.api_key}"} if served.api_key else {}
    started = time.time()

    async def forward() -> httpx.Response:
        async with httpx.AsyncClient(timeout=served.timeout) as client:
            return await client.post(f"{served.base_url}/chat/completions", json=payload, headers=headers)

    try:
        reply = await _unless_disconnected(request, forward())
        data = reply.json() if reply is not None else None
    except (httpx.HTTPError, ValueError) as exc:
        raise APIError(
            502,
            f"model {body.model!r}: {served.base_url} failed: {type(exc).__name__}: {exc}",
            "model",
            "upstream_error",
        ) from None
    if reply is None:  # the client went away (a cancelled sub-agent): nothing is recorded
        return Response(status_code=499), None, []
    if reply.status_code == 400:  # the request itself (the agent's): its error, as the upstream words it
        return JSONResponse(data, status_code=400), None, []
    if reply.status_code != 200:  # the upstream's own trouble (its key, its load): not the agent's key or request
        raise APIError(502, f"model {body.model!r}: {served.base_url} answered {reply.status_code}: {reply.text[:300]}",
                       "model", "upstream_error")  # fmt: skip
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise APIError(502, f"model {body.model!r}: {served.base_url} sent no choices", "model", "upstream_error")
    data["id"] = "chatcmpl-" + secrets.token_hex(12)
    calls = []
    for choice in choices:
        prompt_ids, ids, logprobs = _upstream_ids(data, choice)
        calls.append(Call(
            agent=place.agent, model=body.model, lineage=place.lineage, parent_call=place.parent_call,
            prompt_ids=prompt_ids, completion_ids=ids,
            sampled_logprobs=logprobs, policy_version=0,
            trainable=False, finish_reason=_finish(choice.get("finish_reason")), temperature=body.temperature,
            top_p=body.top_p, started_at=started, ended_at=time.time(),
        ))  # fmt: skip
    return JSONResponse(data), data["id"], calls


def _check_open(record: EpisodeRecord) -> None:
    """409 unless the episode still takes calls: not ended (finished, failed, expired, deleted) nor being finished."""
    episode = record.episode
    if episode.status == "running" and not record.finishing:
        return
    ended = {EXPIRED: "expired", DELETED: "deleted"}.get(episode.failure_reason)  # ended by the gateway, not the agent
    state = ended or ("finishing" if record.finishing else episode.status)
    raise APIError(409, f"episode is {state} and takes no more calls; create a new one", code="episode_finished")


@contextlib.asynccontextmanager
async def _appending(record: EpisodeRecord):
    """Held while a request appends its calls and commits them. The episode is checked again first: a finish
    or an expiry may have ended it while the call generated, and a call never lands in an episode whose end
    was acknowledged (it answers 409 and is recorded nowhere)."""
    async with record.appending:
        _check_open(record)
        yield


def _upstream_ids(data: dict, choice) -> tuple[list[int], list[int], list[float]]:
    """Prompt ids, completion ids and their logprobs as a vLLM server returns them; empty when absent or malformed."""
    try:
        ids = [int(i) for i in choice.get("token_ids") or []]
        logprobs = [float(t["logprob"]) for t in ((choice.get("logprobs") or {}).get("content") or [])]
        prompt_ids = [int(i) for i in data.get("prompt_token_ids") or []]
    except (AttributeError, KeyError, TypeError, ValueError):
        return [], [], []
    return prompt_ids, ids, logprobs if len(logprobs) == len(ids) else [0.0] * len(ids)


def _finish(reason: str | None) -> str:
    return reason if reason in ("stop", "length", "tool_calls") else "stop"


def _assistant_message(
    policy: Policy, completion: Completion, forced: str, body: ChatRequest
) -> tuple[Message, str, str | None]:
    """The OpenAI assistant message for a completion, its finish_reason, and any tool-call error."""
    text = policy.decode(completion.ids, skip_special=True)
    if completion.stop_text:  # cut at the earliest stop string, as OpenAI and vLLM do, whichever the engine named
        cuts = [at for s in {completion.stop_text, *body.stops()} if (at := text.find(s)) >= 0]
        text = text[: min(cuts, default=len(text))]
    text = forced + text
    if body.tool_choice == "none":
        return Message(role="assistant", content=text), completion.finish_reason, None
    parsed = parse_tool_calls(text, {t.function.name for t in body.tools or ()}, policy.tool_format)
    error = parsed.error
    if isinstance(body.tool_choice, NamedToolChoice) and not error:
        wanted = body.tool_choice.function["name"]
        if [name for name, _ in parsed.calls] != [wanted]:
            error = f"tool_choice asked for one call to {wanted!r}"
    if error or not parsed.calls:
        return Message(role="assistant", content=text), completion.finish_reason, error
    calls = [
        ToolCall(id="call_" + secrets.token_hex(8), function=FunctionCall(name=n, arguments=a)) for n, a in parsed.calls
    ]
    return Message(role="assistant", content=parsed.content, tool_calls=calls), "tool_calls", None


def _choice(policy: Policy, index: int, message: Message, finish: str, with_logprobs: Completion | None) -> dict:
    out = {
        "index": index,
        "message": {"role": "assistant", "content": message.content, "refusal": None},
        "finish_reason": finish,
        "logprobs": None,
    }
    if message.tool_calls:
        out["message"]["tool_calls"] = [c.model_dump() for c in message.tool_calls]
    if with_logprobs is not None:
        out["logprobs"] = {
            "content": [
                {
                    "token": policy.decode([i]),
                    "logprob": lp,
                    "bytes": policy.token_bytes(i),
                    "top_logprobs": [],
                    "id": i,
                }
                for i, lp in zip(with_logprobs.ids, with_logprobs.logprobs)
            ]
        }
    return out


def _report_death(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s stopped: %r", task.get_coro().__qualname__, task.exception())


async def _expire_sessions(store: EpisodeStore, recorder: Recorder | None, ttl: float) -> None:
    """Every so often: episodes idle for `ttl` seconds with no call in flight are finished as failed
    (EXPIRED), and with a recorder every episode idle that long leaves memory (the store keeps it)."""
    unrecorded: set[str] = set()  # expired here, their end not yet written to the recorder
    while True:
        await asyncio.sleep(min(ttl / 4, 30.0))
        now = time.monotonic()
        for episode_id in store.ids():
            record = store.get(episode_id)
            if record is None or record.in_flight or record.finishing or now - record.touched < ttl:
                continue
            if record.episode.status == "running":
                record.episode = record.episode.model_copy(update={"status": "failed", "failure_reason": EXPIRED})
                store.expired += 1
                if recorder is not None:
                    unrecorded.add(episode_id)
            if recorder is not None:
                if episode_id in unrecorded:
                    try:
                        await asyncio.to_thread(recorder.finish, record.episode)
                    except RecordError:  # the store ended it first (a cycle expired it): that end stands
                        pass
                    except Exception as exc:  # the store down a moment: kept in memory, written next round
                        log.error("episode %s: could not record its expiry (%s: %s); trying again", episode_id,
                                  type(exc).__name__, exc)  # fmt: skip
                        continue
                    unrecorded.discard(episode_id)
                how = "expired" if record.episode.failure_reason == EXPIRED else record.episode.status
                store.forget(episode_id, how)  # its key now gets 409 "expired", not 401 "invalid API key"


async def _episode_response(episode) -> Response:
    # pydantic serialises the long id lists itself (FastAPI's jsonable_encoder would walk them in Python),
    # in a thread: a long episode takes a while and the event loop serves everyone else meanwhile
    return Response(await asyncio.to_thread(episode.model_dump_json), media_type="application/json")


async def _unless_disconnected(request: Request, work, poll_seconds: float = 0.05):
    """The result of `work`, or None when the client disconnects first (the work is then cancelled: the
    engine frees a cancelled request's rows at its next decode step)."""
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.wait({task}, timeout=poll_seconds)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return None
    return task.result()


def _located(errors: Sequence[dict], body) -> tuple[dict, list]:
    """The error to report and its path in the body. Pydantic names a union's members in an error's `loc`
    (`messages.0.content.str`, `stop.list[str].0`); those names are dropped, and of the errors one union gives
    (one a member), the one that went deepest into the input is the one that says what is wrong."""
    path, union = _input_path(errors[0], body)
    if union is None:  # no union on the way
        return errors[0], path
    same = [error for error in errors if error["loc"][: len(union)] == union]
    return max(((error, _input_path(error, body)[0]) for error in same), key=lambda found: len(found[1]))


def _input_path(error: dict, body) -> tuple[list, tuple | None]:
    """The positions of an error's `loc` in the request body, and the `loc` up to a union's member name, or None."""
    loc = error["loc"]
    skip = 1 if loc[:1] == ("body",) else 0
    path, member = input_path(loc[skip:], body, error["type"] == "missing")
    return path, None if member is None else tuple(loc[: skip + member])


def _error_response(status: int, message: str, param: str | None, code: str | None) -> JSONResponse:
    kinds = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
    kind = kinds.get(status, "server_error" if status >= 500 else "invalid_request_error")
    error = {"message": _printable(message), "type": kind, "param": param and _printable(param), "code": code}
    # the openai client retries a 409 twice by default: an ended episode stays ended, so it is told not to
    headers = {"x-should-retry": "false"} if code == "episode_finished" else None
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def _printable(text: str) -> str:
    """An error that quotes the bad input must still be sendable: lone surrogates become escapes."""
    return text.encode("utf-8", "backslashreplace").decode()
