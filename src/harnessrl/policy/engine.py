"""Continuous batching for a Hugging Face causal LM on one device, with a KV cache.

One background thread owns the model. Requests join the running batch at the next decode step
and leave it the step they finish, so a short request never waits for a long one. Each step of the
loop does a bounded amount of prefill, then one decode forward for all running rows:
- prompts up to `prefill_chunk` tokens are prefilled together, shortest first, as many as fit in
  `prefill_budget` padded tokens (so a batch is never padded to a long prompt);
- a longer prompt is prefilled `prefill_chunk` tokens per step into its own KV cache (chunked
  prefill), so a 3,000-token prompt delays the running rows' next token by one chunk, not by all of it;
- while rows are decoding, a long prompt's chunk is also held to about `prefill_share` times the time
  of a decode step (both measured as the engine runs; at least 16 tokens): on a CPU a prefill token
  costs about what a decode token does, so without this a 512-token chunk still makes each of the
  running rows' steps ~20x slower. With the default 0.5 their tokens come about 2x slower while a
  long prompt is prefilled; `prefill_share=None` lifts the cap. Short prompts are never held back:
  they are bounded by `prefill_chunk` already, and holding them would cost throughput whenever
  requests arrive one by one (as over HTTP).
A prompt whose KV cache is complete samples its first token and its KV rows are left-padded into the
running batch. Rows are left-aligned with padding: each row keeps its own position ids and the
attention mask hides the padding.

With `prefix_cache` > 0 (tokens; off by default), the KV cache of each finished row is kept, least
recently used first out, and a new prompt that begins with tokens one of them holds (an agent's next
turn: the earlier prompt, the reply, then the tool's result) is prefilled from there as a chunked
prompt is: an episode's turn n no longer prefills turns 1..n-1 again (vLLM's automatic prefix caching,
at token rather than block granularity). A kept entry serves any prompt sharing its first tokens
(keys depend only on the tokens before them), from `MIN_REUSE` tokens on. Weight updates clear it.

Weights can be replaced between two decode steps (`update_weights`): the version goes up by one
and rows still generating continue from their cache (in-flight update, as PipelineRL does). A
completion's `policy_version` is the version that sampled its first token; its logprobs are the
ones actually sampled, whatever version drew them.

The engine knows token ids only: no chat templates, no HTTP, no episodes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import numbers
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
import transformers
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from harnessrl.policy.sampling import sample_next

TRANSFORMERS_NEEDED = "5.24"  # pyproject.toml's floor: older caches run without error and decode garbage


def check_transformers(version: str) -> None:
    """Refuse a transformers older than pyproject.toml's floor (one put on PYTHONPATH, or pinned by another
    package and installed with --no-deps): under transformers 5.17 (torch 2.11, a lent GPU machine's image) a
    trained tiny-base scored 0.0 on every probe skill, without an error."""
    from packaging.version import Version

    if Version(version) < Version(TRANSFORMERS_NEEDED):
        raise ImportError(
            f"harnessrl needs transformers>={TRANSFORMERS_NEEDED} (pyproject.toml); this environment has {version}: "
            f"pip install 'transformers>={TRANSFORMERS_NEEDED},<6'"
        )


check_transformers(transformers.__version__)

RIDE_ALONG = 8  # finished rows stay in the batch until a join, or until they are 1 / RIDE_ALONG of it
MIN_REUSE = 32  # fewer shared tokens than this: the prompt is prefilled whole, batched with the other short ones


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False  # run to max_tokens (benchmarks, fixed-length tests), as vLLM's option

    def __post_init__(self) -> None:
        # checked here, not in the step: a bad value there fails every request of the batch, and NaN samples garbage
        if not _real(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature: a finite number >= 0 (0 is greedy), not {self.temperature!r}")
        if not _real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: a number in (0, 1], not {self.top_p!r}")
        if not _integer(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: an integer >= 1, not {self.max_tokens!r}")
        if not isinstance(self.stop, list | tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop: a list of non-empty strings, not {self.stop!r}")
        if self.seed is not None and not _integer(self.seed):
            raise ValueError(f"seed: an integer or None, not {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: true or false, not {self.ignore_eos!r}")


@dataclass
class Completion:
    ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    policy_version: int
    stop_text: str | None = None  # the stop string that ended it, if one did
    cached_tokens: int | None = None  # prompt tokens prefilled from the prefix cache; None: the backend does not say


class _RowFuture(Future):
    abandoned = False  # the asyncio caller was cancelled: stop decoding this row


@dataclass(eq=False)  # rows are compared by identity (`in`, `remove`)
class _Row:
    prompt: list[int]
    params: SamplingParams
    future: _RowFuture
    generator: torch.Generator | None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version: int = -1
    done: Completion | None = None
    cache: DynamicCache | None = None  # a long prompt's KV cache while it is prefilled chunk by chunk
    prefilled: int = 0  # prompt tokens already in `cache`
    reused: int = 0  # of which taken from the prefix cache


class NotEmbedded(ValueError):
    """A prompt id the model has no embedding row for (an added token past the rows)."""

    def __init__(self, token: int, rows: int):
        super().__init__(f"prompt id {token} is not one the model embeds (0 to {rows - 1})")
        self.token = token


class Engine:
    def __init__(
        self,
        model,
        eos_ids: set[int],
        decode,
        max_batch: int = 64,
        prefill_chunk: int = 512,
        prefill_budget: int = 16384,
        prefill_share: float | None = 0.5,
        prefix_cache: int = 0,
        vocab: int | None = None,
    ):
        self.model = model
        self.vocab = vocab  # the tokenizer's size: ids from there on are never sampled (sampling.sample_next)
        self.eos_ids = eos_ids
        self.decode = decode  # ids -> text, used for stop strings only
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk  # longer prompts are prefilled this many tokens per step
        self.prefill_budget = prefill_budget  # padded tokens of short prompts prefilled together per step
        self.prefill_share = prefill_share  # prefill time per step / decode time per step, while rows decode
        self._decode_seconds = self._token_seconds = 0.0  # moving averages: a decode step, a prefill token
        self._prefilling: list[_Row] = []  # admitted, prompt not yet in the batch's cache
        self.prefix_cache = prefix_cache  # tokens of finished rows' KV kept to prefill later prompts from
        self._prefixes: OrderedDict[int, tuple[torch.Tensor, list]] = OrderedDict()  # LRU: token ids, per-layer KV
        self._kept = itertools.count()  # the entries' keys
        self.prefix_hits = self.prefix_tokens_reused = 0
        self.context = model.config.max_position_embeddings
        self.rows = model.get_input_embeddings().num_embeddings  # prompt ids from here on have no embedding
        self.version = 0
        self._pending: deque[_Row] = deque()
        self._wake = threading.Condition()
        self._step_lock = threading.Lock()  # held for a whole step; weight updates wait for it
        self._closed = False
        self._reset_batch()
        self._thread = threading.Thread(target=self._run, name="harnessrl-engine", daemon=True)
        self._thread.start()

    # ---- public API ------------------------------------------------------------------------

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Future:
        """Queue one completion; the future resolves to a Completion."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if len(prompt_ids) >= self.context:
            raise ValueError(f"prompt has {len(prompt_ids)} tokens; the model's context is {self.context}")
        # refused here, not in the forward: a failed forward fails every row of its step, other requests' too
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.rows:  # in C: a 4k prompt costs no Python loop
            raise NotEmbedded(next(i for i in prompt_ids if not 0 <= i < self.rows), self.rows)
        gen = None
        if params.seed is not None:
            gen = torch.Generator().manual_seed(params.seed)
        row = _Row(list(prompt_ids), params, _RowFuture(), gen)
        with self._wake:
            if self._closed:
                raise RuntimeError("engine is closed")
            self._pending.append(row)
            self._wake.notify()
        return row.future

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> list[Completion]:
        """n completions of one prompt; with a seed, choice i uses seed + i."""
        if not _integer(n) or n < 1:
            raise ValueError(f"n: an integer >= 1, not {n!r}")
        futures = [self.submit(prompt_ids, _for_choice(params, i)) for i in range(n)]
        try:
            return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
        except asyncio.CancelledError:  # e.g. an episode timed out: free its rows at the next step
            for f in futures:
                f.abandoned = True
            raise

    @property
    def active(self) -> int:
        """Requests admitted and not yet finished (prefilling or decoding)."""
        return sum(not r.future.done() for r in self._batch_rows()) + len(self._prefilling)

    def _batch_rows(self) -> list[_Row]:
        """The batch's rows (finished ones riding along included) and this step's prefilled rows about to join it."""
        return [*self._rows, *(r for rows, *_ in self._joining for r in rows)]

    def generate_sync(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        return self.submit(prompt_ids, params).result()

    def update_weights(self, state_dict: dict[str, torch.Tensor], at_least: int = 0) -> int:
        """Replace the weights between two decode steps; returns the new version: one up, or `at_least` (a resumed
        trainer's weights keep the version they were saved at)."""
        with self._step_lock, torch.no_grad():
            self.model.load_state_dict(state_dict)
            self._prefixes.clear()  # keys and values of the old weights
            for r in self._prefilling:  # a prompt part-prefilled (chunked, or from the cache) starts over
                r.cache, r.prefilled, r.reused = None, 0, 0
            self.version = max(self.version + 1, at_least)
            return self.version

    def close(self, timeout: float = 30) -> None:
        """Stop the engine; requests not finished fail. Waits up to `timeout` seconds for the step in flight: one
        that outlasts it fails its rows when it ends (the engine's thread fails every request it holds)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=timeout)
        if not self._thread.is_alive():  # a thread that died of an error failed nothing: what it held fails here
            with self._wake:
                self._fail_all_closed()

    # ---- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._wake:
                while not self._closed and not self._pending and not self._rows and not self._prefilling:
                    self._wake.wait()
                if self._closed:
                    self._fail_all_closed()
                    return
                self._prefilling += self._take_pending()
            with self._step_lock, torch.inference_mode():
                try:
                    self._prefill_step()
                    self._rebuild()
                    if self._rows:
                        self._decode_step()
                except Exception as exc:  # a failed forward fails its requests, never the engine
                    self._fail([*self._prefilling, *self._prefill_rows, *self._batch_rows()], exc)
                    self._prefilling = []
                    self._reset_batch()

    def _fail_all_closed(self) -> None:
        """Every request the engine holds fails: it was closed (under `_wake`)."""
        closed = RuntimeError("engine closed before the completion finished")
        self._fail([*self._pending, *self._prefilling, *self._batch_rows()], closed)

    @staticmethod
    def _fail(rows: list[_Row], exc: BaseException) -> None:
        for row in rows:
            try:
                if not row.future.done():
                    row.future.set_exception(exc)
            except InvalidStateError:  # its caller cancelled it in between: nothing to tell
                pass

    def _take_pending(self) -> list[_Row]:
        live = sum(not r.future.done() for r in self._rows)  # finished rows riding along leave at the next join
        new = []
        while self._pending and live + len(self._prefilling) + len(new) < self.max_batch:
            row = self._pending.popleft()
            if row.future.set_running_or_notify_cancel() and not row.future.abandoned:  # else its caller gave up
                new.append(row)
        return new

    def _reset_batch(self) -> None:
        self._rows: list[_Row] = []
        self._cache: Cache | None = None  # per layer keys / values (B, H, T, D)
        self._mask = torch.zeros(0, 0, dtype=torch.long)  # (B, T) 1 = real token
        self._last = torch.zeros(0, dtype=torch.long)  # (B,) sampled, not yet in the cache
        self._joining: list[tuple] = []  # this step's prefilled rows: (rows, per-layer KV, mask, first tokens)
        self._prefill_rows: list[_Row] = []  # rows this step prefills whole, out of _prefilling (failed with it)

    def _prefill_step(self) -> None:
        """This step's prefill: short prompts together (shortest first, within the budget), then one
        chunk of the oldest long prompt."""
        for r in [r for r in self._prefilling if r.future.abandoned]:  # their callers gave up
            r.future.set_exception(asyncio.CancelledError())
        waiting = [r for r in self._prefilling if not r.future.abandoned]
        chunk = self.prefill_chunk
        if self._rows and self.prefill_share is not None and self._token_seconds > 0:
            # running rows wait for this step: a long prompt's chunk is held to a share of a decode step's time
            chunk = min(chunk, max(16, int(self.prefill_share * self._decode_seconds / self._token_seconds)))
        for r in waiting:
            if r.cache is None and self._prefixes:
                self._reuse_prefix(r)
        # a prompt whose start came from the prefix cache and whose rest is short: like a short prompt, never held back
        resumed = [
            r
            for r in waiting
            if r.reused and r.prefilled == r.reused and len(r.prompt) - r.reused <= self.prefill_chunk
        ]
        short = sorted(
            (r for r in waiting if r.cache is None and len(r.prompt) <= self.prefill_chunk), key=lambda r: len(r.prompt)
        )
        batch = [r for i, r in enumerate(short) if (i + 1) * len(r.prompt) <= self.prefill_budget] or short[:1]
        # chunked: a long prompt, or one whose cached start leaves a long rest (from where it is)
        long = next(
            (r for r in waiting if r not in resumed and (r.cache is not None or len(r.prompt) > self.prefill_chunk)),
            None,
        )
        self._prefilling = [r for r in waiting if r not in batch and r not in resumed]
        self._prefill_rows = [*resumed, *batch]
        for r in resumed:
            size = len(r.prompt) - r.prefilled
            self._timed(lambda r=r, size=size: self._prefill_chunk(r, size), size)
        if batch:
            self._timed(lambda: self._prefill_whole(batch), len(batch) * max(len(r.prompt) for r in batch))
        if long is not None:
            size = min(chunk, len(long.prompt) - long.prefilled)
            if self._timed(lambda: self._prefill_chunk(long, size), size):
                self._prefilling.remove(long)

    def _timed(self, prefill, tokens: int):
        """Run a prefill and fold its seconds per (padded) token into the moving average."""
        started = time.perf_counter()
        result = prefill()
        self._token_seconds = _average(self._token_seconds, (time.perf_counter() - started) / tokens)
        return result

    def _reuse_prefix(self, r: _Row) -> None:
        """Start `r`'s cache from the kept entry sharing the most first tokens with its prompt (at least one
        prompt token is left to prefill: its logits sample the first token)."""
        prompt = torch.tensor(r.prompt)
        best, length = None, MIN_REUSE - 1
        for key, (ids, _) in self._prefixes.items():
            n = min(len(ids), len(prompt) - 1)
            same = ids[:n] == prompt[:n]
            shared = n if bool(same.all()) else int((~same).nonzero()[0])
            if shared > length:
                best, length = key, shared
        if best is None:
            return
        self._prefixes.move_to_end(best)
        cache = DynamicCache()
        for layer, (k, v) in enumerate(self._prefixes[best][1]):
            cache.update(k[:, :, :length], v[:, :, :length], layer)
        r.cache, r.prefilled, r.reused = cache, length, length
        self.prefix_hits += 1
        self.prefix_tokens_reused += length

    def _keep_prefix(self, kv: list, i: int, r: _Row) -> None:
        """Keep finished row i's KV (its prompt and every sampled token but the last, which was never fed)."""
        n = len(r.prompt) + len(r.ids) - 1
        if r.version != self.version or n > self.prefix_cache:  # drawn across a weight update, or too long
            return
        kv = [(k[i : i + 1, :, -n:].clone(), v[i : i + 1, :, -n:].clone()) for k, v in kv]
        self._prefixes[next(self._kept)] = (torch.tensor(r.prompt + r.ids[:-1]), kv)
        while sum(len(ids) for ids, _ in self._prefixes.values()) > self.prefix_cache:
            self._prefixes.popitem(last=False)

    def _prefill_whole(self, new: list[_Row]) -> None:
        """Prefill whole prompts together (left-padded), sample their first tokens, merge them into the batch."""
        width = max(len(r.prompt) for r in new)
        ids = torch.tensor([[0] * (width - len(r.prompt)) + r.prompt for r in new])  # (n, L)
        mask = torch.tensor([[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in new])
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        cache = DynamicCache()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, logits_to_keep=1)
        self._join(new, _kv(cache), mask, out.logits[:, -1])

    def _prefill_chunk(self, r: _Row, size: int) -> bool:
        """Prefill the next `size` tokens of one long prompt into its own cache; True once the row joined the batch."""
        start, r.cache = r.prefilled, r.cache or DynamicCache()
        chunk = r.prompt[start : start + size]
        positions = torch.arange(start, start + len(chunk))[None]
        out = self.model(input_ids=torch.tensor([chunk]), position_ids=positions, cache=r.cache, logits_to_keep=1)
        r.prefilled += len(chunk)
        if r.prefilled < len(r.prompt):
            return False
        self._join([r], _kv(r.cache), torch.ones(1, len(r.prompt), dtype=torch.long), out.logits[:, -1])
        r.cache = None
        return True

    def _join(self, new: list[_Row], kv: list, mask: torch.Tensor, logits: torch.Tensor) -> None:
        """Sample the first tokens of prefilled rows; they join the running batch at this step's `_rebuild`."""
        for r in new:
            r.version = self.version
        self._joining.append((new, kv, mask, self._sample(new, logits)))
        self._resolve(new, kv)

    def _rebuild(self) -> None:
        """Merge this step's prefilled rows into the batch and drop its finished ones, in one copy of the cache:
        a step where eight rows finish and eight next turns join copies it once. Without a join, finished rows
        ride along (fed, their tokens dropped) until they are 1 / RIDE_ALONG of the batch: an agent's finished
        turn is mostly followed, a few steps later, by its next turn's join, which then drops it for free."""
        joining = self._joining  # emptied once merged: a merge that fails (out of memory) fails these rows too
        finished = sum(r.future.done() for r in self._rows)
        if not joining and (not self._rows or RIDE_ALONG * finished < len(self._rows)):
            return
        parts = [(self._rows, _kv(self._cache), self._mask, self._last)] if self._rows else []
        rows, masks, last, blocks = [], [], [], [[] for _ in (parts or joining)[0][1]]
        for part_rows, kv, mask, part_last in parts + joining:
            keep = [i for i, r in enumerate(part_rows) if not r.future.done()]
            if not keep:
                continue
            mask = mask[keep]
            start = int(mask.any(0).nonzero()[0])  # drop columns that are padding in every kept row
            for layer, (k, v) in zip(blocks, kv):  # slices of consecutive rows: views, copied once, into the slab
                layer += [(k[run, :, start:], v[run, :, start:]) for run in _runs(keep)]
            rows += [part_rows[i] for i in keep]
            masks.append(mask[:, start:])
            last.append(part_last[keep])
        if not rows:
            self._reset_batch()
            return
        width = max(m.shape[1] for m in masks)
        self._rows, self._cache = rows, _slab_cache(blocks, width)
        self._mask, self._last = torch.cat([_left_pad(m, width) for m in masks]), torch.cat(last)
        self._joining = []

    def _decode_step(self) -> None:
        """Feed every row its last sampled token; sample the next one."""
        started = time.perf_counter()
        self._decode()
        self._decode_seconds = _average(self._decode_seconds, time.perf_counter() - started)

    def _decode(self) -> None:
        self._mask = torch.cat([self._mask, torch.ones(len(self._rows), 1, dtype=torch.long)], dim=1)
        positions = torch.tensor([[len(r.prompt) + len(r.ids) - 1] for r in self._rows])
        out = self.model(
            input_ids=self._last[:, None], attention_mask=self._mask, position_ids=positions, cache=self._cache
        )
        live = [i for i, r in enumerate(self._rows) if not r.future.done()]  # finished rows ride along
        self._last[live] = self._sample([self._rows[i] for i in live], out.logits[live, -1])
        self._resolve(self._rows, _kv(self._cache))

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> torch.Tensor:
        temperature = torch.tensor([r.params.temperature for r in rows])
        top_p = torch.tensor([r.params.top_p for r in rows])
        ids, logprobs = sample_next(logits, temperature, top_p, [r.generator for r in rows], self.vocab)
        for r, token, lp in zip(rows, ids.tolist(), logprobs.tolist()):
            r.ids.append(token)
            r.logprobs.append(lp)
            r.done = self._finished(r)
        return ids

    def _finished(self, r: _Row) -> Completion | None:
        reason, stop_text = None, None
        if r.ids[-1] in self.eos_ids and not r.params.ignore_eos:
            reason = "stop"
        elif r.params.stop and (stop_text := self._stop_hit(r)):
            reason = "stop"
        elif len(r.ids) >= r.params.max_tokens or len(r.prompt) + len(r.ids) >= self.context:
            reason = "length"
        if reason is None:
            return None
        return Completion(r.ids, r.logprobs, reason, r.version, stop_text, r.reused)

    def _stop_hit(self, r: _Row) -> str | None:
        # a stop string completed by the newest token lies within the last few tokens' text
        tail = self.decode(r.ids[-(4 * max(map(len, r.params.stop)) + 4) :])
        # of several, the one that starts first (OpenAI and vLLM cut there), not the first listed
        hits = [(at, s) for s in r.params.stop if (at := tail.find(s)) >= 0]
        return min(hits)[1] if hits else None

    def _resolve(self, rows: list[_Row], kv: list) -> None:
        """Resolve rows that finished (keeping their KV for later prompts) and rows whose caller cancelled;
        `_rebuild` drops them from the batch."""
        for i, r in enumerate(rows):
            if r.future.done():
                continue
            if r.done is not None:
                if self.prefix_cache:
                    self._keep_prefix(kv, i, r)
                r.future.set_result(r.done)
            elif r.future.abandoned:
                r.future.set_exception(asyncio.CancelledError())


class _SlabLayer(DynamicLayer):
    """A cache layer whose keys / values are views of larger slabs: a decode step writes its new
    key and value in place instead of concatenating (DynamicLayer copies the whole cache per step)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
        super().__init__()
        self.lazy_initialization(keys, values)
        self._length, self._slabs = length, [keys, values]
        self._view()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self._length + key_states.shape[2]
        if end > self._slabs[0].shape[2]:
            self._slabs = [
                _stack((slab[:, :, : self._length],), self._length, 2 * end - self._length) for slab in self._slabs
            ]
        self._slabs[0][:, :, self._length : end] = key_states
        self._slabs[1][:, :, self._length : end] = value_states
        self._length = end
        self._view()
        return self.keys, self.values

    def _view(self) -> None:
        self.keys, self.values = (slab[:, :, : self._length] for slab in self._slabs)


def _slab_cache(layers: list[list[tuple[torch.Tensor, torch.Tensor]]], width: int, room: int = 128) -> Cache:
    """The batch's cache: each layer's blocks of rows ((b, H, t, D) keys and values, t <= width) stacked on the
    batch axis, right-aligned at `width` tokens behind zeros, with `room` tokens to decode into. Each block is
    copied once, straight into its slab (no padded or concatenated copy in between)."""
    return Cache(layers=[_SlabLayer(_stack(keys, width, room), _stack(values, width, room), width)
                         for keys, values in (zip(*blocks) for blocks in layers)])  # fmt: skip


def _stack(blocks: tuple[torch.Tensor, ...], width: int, room: int) -> torch.Tensor:
    first = blocks[0]
    slab = first.new_empty(sum(b.shape[0] for b in blocks), first.shape[1], width + room, first.shape[3])
    row = 0
    for block in blocks:
        rows, pad = block.shape[0], width - block.shape[2]
        slab[row : row + rows, :, :pad] = 0  # masked, but never garbage: 0 * nan is nan in attention
        slab[row : row + rows, :, pad:width] = block
        row += rows
    return slab


def _runs(index: list[int]) -> list[slice]:
    """Sorted row indices as slices of consecutive rows: [0, 1, 2, 5, 6] -> [0:3, 5:7]."""
    runs: list[slice] = []
    for i in index:
        if runs and runs[-1].stop == i:
            runs[-1] = slice(runs[-1].start, i + 1)
        else:
            runs.append(slice(i, i + 1))
    return runs


def _kv(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _left_pad(mask: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad a (B, T) attention mask with zeros to `width` columns."""
    return F.pad(mask, [width - mask.shape[1], 0])


def _average(mean: float, value: float, weight: float = 0.2) -> float:
    """An exponential moving average; the first value starts it."""
    return value if not mean else (1 - weight) * mean + weight * value


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _for_choice(params: SamplingParams, i: int) -> SamplingParams:
    if params.seed is None or i == 0:
        return params
    return dataclasses.replace(params, seed=params.seed + i)
