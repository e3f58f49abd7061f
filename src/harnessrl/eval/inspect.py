"""`harnessrl inspect`: one recorded episode, token by token, as the trainer will see it.

An episode with sub-agents first shows its call tree (`harnessrl.calltree`): each lineage indented
under the call that spawned it, frozen ones marked, and critical vs total steps. Every call gets a
header (agent, policy_version, trainable, finish_reason, extends_call, and the training sequence it
merged into), indented like its lineage; its new prompt tokens are dim, its completion tokens green
where they carry loss and red where they do not, underlined where they were sampled with
probability below 0.1. The loss mask is read off `train.sequences.episode_sequences`, never
recomputed here, so what is shown is what the trainer trains on.

It knows episodes, tokenizers and the terminal; it knows nothing about HTTP or rewards.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from harnessrl.calltree import critical_steps, depth, lineage_of, lineages
from harnessrl.train.sequences import episode_sequences
from harnessrl.types import Call, Episode, line_error

SURPRISE = 0.1  # completion tokens sampled with a lower probability are underlined
TRAINED = ("green", "bright_green")  # alternate shades show token boundaries
NOT_TRAINED = ("red", "bright_red")


class EpisodeNotFound(ValueError):
    pass


class NotThisTokenizer(ValueError):
    """The episode holds ids beyond the tokenizer's vocabulary: another model's (they would decode to nothing)."""


def load_episode(
    source: str,
    run: Path | None = None,
    index: int | None = None,
    episode_id: str | None = None,
) -> Episode:
    """`source` is a JSONL file of episodes (pick by `index`, default 0, or `episode_id`), or, with
    `run`, the id of an episode in one of the run folder's *.jsonl files (searched in name order).
    Only the episode asked for must be intact: a cut or bad line elsewhere (a killed run's last) is
    not read."""
    path = Path(source)
    if index is not None and episode_id is not None:
        raise EpisodeNotFound("--index and --id each pick an episode: give one")
    if path.is_file():
        if run is not None:
            raise EpisodeNotFound(
                f"{path} is a file: --run looks EPISODE up as an id in a run folder, give one or the other"
            )
        if episode_id is not None:
            found = _find_in_file(path, episode_id)
            if found is None:
                raise EpisodeNotFound(f"{path}: no episode with id {episode_id}")
            return found
        index = 0 if index is None else index
        held = 0
        for number, raw in _lines(path):
            if held == index:
                return _parse(path, number, raw)
            held += 1
        if not held:
            raise EpisodeNotFound(f"{path}: no episodes (the file is empty)")
        raise EpisodeNotFound(f"{path}: --index {index}, but the file holds {held} lines (0..{held - 1})")
    if run is None and path.is_dir():  # a run folder given as EPISODE
        raise EpisodeNotFound(
            f"{source}: a folder; give a JSONL file of episodes, or an episode id with --run {source}"
        )
    if run is None:
        raise EpisodeNotFound(f"{source}: no such file (to look it up as an episode id, give --run RUN_DIR)")
    if index is not None or episode_id is not None:
        raise EpisodeNotFound("--index and --id pick from a JSONL file; with --run, EPISODE is the id")
    if not run.is_dir():
        raise EpisodeNotFound(f"{run}: no such run folder")
    files = sorted(run.rglob("*.jsonl"))  # rollouts/ too
    for path in files:
        if (found := _find_in_file(path, source)) is not None:
            return found
    names = ", ".join(str(p.relative_to(run)) for p in files) or "none"  # sft/metrics.jsonl beside metrics.jsonl
    raise EpisodeNotFound(f"{run}: no episode with id {source} in its *.jsonl files ({names})")


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of every non-blank line, read as they come (a rollouts file can be large)."""
    with open(path, "rb") as f:
        yield from ((n, raw) for n, raw in enumerate(f, start=1) if raw.strip())


def _find_in_file(path: Path, episode_id: str) -> Episode | None:
    needle = episode_id.encode()
    for number, raw in _lines(path):
        if needle not in raw:  # cheap filter before parsing
            continue
        try:
            row = json.loads(raw)
        except ValueError:  # a cut or non-UTF-8 line holding the id: named, not skipped
            return _parse(path, number, raw)
        if isinstance(row, dict) and row.get("id") == episode_id:
            return _parse(path, number, raw)
    return None


def _parse(path: Path, number: int, raw: bytes) -> Episode:
    try:
        return Episode.model_validate_json(raw)
    except ValidationError as exc:  # bad JSON and bad UTF-8 are ValidationErrors too
        raise line_error(path, number, exc) from None


def load_tokenizer(model: str):
    """Only the tokenizer of 'tiny', a shipped base, a preset, a .gguf file (converted once) or a local
    Hugging Face folder (no weights)."""
    from transformers import AutoTokenizer

    from harnessrl.policy import PolicyLoadError
    from harnessrl.policy.sources import SHIPPED, SourceError, local_folder
    from harnessrl.policy.tiny import build_tokenizer

    if model == "tiny":
        return build_tokenizer()
    try:
        path = SHIPPED[model] if model in SHIPPED else local_folder(model)
    except SourceError as exc:
        raise PolicyLoadError(str(exc)) from None
    if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise PolicyLoadError(
            f"--model {model}: not 'tiny', 'tiny-base', a preset, a .gguf or a folder with a tokenizer"
        )
    return AutoTokenizer.from_pretrained(path)


def embedding_rows(model: str) -> int:
    """The token ids `model` can sample: its config's vocab_size (a padded embedding can exceed the tokenizer); 0 for
    'tiny', whose embedding is its tokenizer's size."""
    from transformers import AutoConfig

    from harnessrl.policy.sources import SHIPPED, local_folder

    if model == "tiny":
        return 0
    config = AutoConfig.from_pretrained(SHIPPED[model] if model in SHIPPED else local_folder(model))
    return getattr(config.get_text_config(), "vocab_size", 0) or 0


def check_vocabulary(episode: Episode, tokenizer, rows: int = 0) -> None:
    """NotThisTokenizer where an id of the episode is beyond the tokenizer's vocabulary and the model's `rows`."""
    size = max(len(tokenizer), rows)
    for index, call in enumerate(episode.calls):
        if (beyond := max(call.prompt_ids + call.completion_ids, default=0)) >= size:
            raise NotThisTokenizer(
                f"episode {episode.id}: call {index} holds token id {beyond}, beyond this tokenizer's vocabulary "
                f"({size} tokens): pass --model the run's model (its config.yaml's model)"
            )


def completion_masks(episode: Episode) -> tuple[list[list[int]], list[int | None]]:
    """Each call's completion loss mask and the index of the training sequence it merged into.

    Read off `episode_sequences`: a call merged into a sequence has its prompt at positions
    [0, len(prompt)) of it, so its completion's mask is the slice right after. A call whose
    sequence was dropped (no loss token at all) has mask 0 everywhere and no sequence. RL trains only sampled
    tokens (a greedy reply carries no loss, `Trainer.rl_step`); a demonstration's are SFT's, so they show as trained.
    """
    masks = [[0] * len(call.completion_ids) for call in episode.calls]
    sequence_of: list[int | None] = [None] * len(episode.calls)
    for s, seq in enumerate(episode_sequences(episode)):
        for index in seq.calls:
            call = episode.calls[index]
            start, end = len(call.prompt_ids), len(call.prompt_ids) + len(call.completion_ids)
            masks[index] = seq.loss_mask[start:end]
            if not episode.demonstrated:
                masks[index] = [m * x for m, x in zip(masks[index], seq.sampled[start:end])]
            sequence_of[index] = s
    return masks, sequence_of


def render(episode: Episode, tokenizer, console: Console, logprobs: bool = False) -> None:
    """Print the episode; `logprobs` adds a line per completion token (position, mask, logprob, p)."""
    masks, sequence_of = completion_masks(episode)
    main = episode.calls[0].agent if episode.calls else "main"
    sequences = len({s for s in sequence_of if s is not None})
    console.print(
        Text(
            _visible(
                f"episode {episode.id} · task {episode.task.id} · status {episode.status} · "
                f"{len(episode.calls)} calls · {sequences} training sequences, {sum(map(sum, masks))} loss tokens"
            ),
            style="bold",
        )
    )
    if episode.reward is not None:
        r = episode.reward
        terms = ", ".join(f"{k} {v:+.3f}" for k, v in r.terms.items())
        flags = f" · flags: {', '.join(r.flags)}" if r.flags else ""
        failure = f" · failure: {r.failure}" if r.failure else ""
        console.print(Text(_visible(f"reward {r.total:+.3f} ({terms}){flags}{failure}")))
    if episode.failure_reason:  # an exception's text, which may quote what the model wrote: shown, not obeyed
        console.print(Text(_visible(f"failed: {episode.failure_reason}"), style="red"))
    console.print(
        Text.assemble(
            "tokens: ",
            ("prompt", "dim"),
            " · ",
            ("completion, trained", TRAINED[0]),
            " · ",
            ("completion, not trained", NOT_TRAINED[0]),
            " · ",
            (f"sampled with p < {SURPRISE}", "underline"),
        )
    )
    tree = lineages(episode.calls)
    level = {t.name: depth(tree, t) for t in tree}
    if len(tree) > 1:
        console.print(call_tree(episode))
    for index, call in enumerate(episode.calls):
        console.print(_header(index, call, sequence_of[index], call.agent != main, level[lineage_of(call)]))
        # prompt: only what is new since the call it extends
        head = _extended_head(episode, call)
        line = f"prompt: {len(call.prompt_ids)} tokens"
        if head:
            line += f", the first {head} are call {call.extends_call}'s prompt + completion; new"
        console.print(Text(line + ":", style="italic"))
        prompt = "".join(map(_visible, _pieces(tokenizer, call.prompt_ids[head:])))
        console.print(Text(prompt, style="dim"))
        # completion: coloured by the loss mask
        mask, pieces = masks[index], _pieces(tokenizer, call.completion_ids)
        mean = sum(call.sampled_logprobs) / max(1, len(call.sampled_logprobs))
        console.print(
            Text(
                f"completion: {len(pieces)} tokens, {sum(mask)} trained, mean logprob {mean:.3f}",
                style="italic",
            )
        )
        console.print(_completion(pieces, mask, call.sampled_logprobs))
        if logprobs:
            console.print(*_listing(pieces, mask, call.sampled_logprobs), sep="\n")


def call_tree(episode: Episode) -> Text:
    """Each lineage on a line, indented under the call that spawned it; frozen calls marked."""
    tree = lineages(episode.calls)
    text = Text(
        f"\ncall tree: {len(tree)} lineages · critical steps {critical_steps(episode.calls)} of {len(episode.calls)}\n",
        style="bold",
    )
    for lineage in tree:
        calls = [episode.calls[i] for i in lineage.calls]
        frozen = sorted({c.model or "policy" for c in calls if not c.trainable})
        line = "  " * depth(tree, lineage) + f"{lineage.name} (agent {lineage.agent})"
        if lineage.parent_call is not None:
            line += f" ← call {lineage.parent_call}"
        line += f": calls {', '.join(map(str, lineage.calls))}"
        text.append(line, style="magenta" if lineage.parent_call is not None else "cyan")
        if frozen:
            text.append(f" · frozen ({', '.join(frozen)})", style="dim")
        text.append("\n")
    return text


def _header(index: int, call: Call, sequence: int | None, sub_agent: bool, level: int = 0) -> Text:
    fields = [
        "  " * level + f"call {index}",
        f"agent {call.agent}" + (" (sub-agent)" if sub_agent else ""),
        *([f"lineage {call.lineage}"] if call.lineage else []),
        *([f"model {call.model}"] if call.model else []),
        *([f"parent_call {call.parent_call}"] if call.parent_call is not None else []),
        f"policy_version {call.policy_version}",
        f"trainable {call.trainable}",
        f"finish_reason {call.finish_reason}",
        f"extends_call {call.extends_call}",
        f"sequence {'none (no loss token)' if sequence is None else sequence}",
    ]
    if call.tool_call_error:
        fields.append(f"tool_call_error: {call.tool_call_error}")
    return Text("\n── " + " · ".join(fields), style="bold magenta" if sub_agent else "bold cyan")


def _completion(pieces: list[str], mask: list[int], logprobs: list[float]) -> Text:
    """Green where trained, red where not, in alternating shades; underlined if p < SURPRISE."""
    text = Text()
    for i, (piece, bit, logprob) in enumerate(zip(pieces, mask, logprobs)):
        colour = (TRAINED if bit else NOT_TRAINED)[i % 2]
        surprise = math.exp(logprob) < SURPRISE
        text.append(_visible(piece), style=f"{colour} underline" if surprise else colour)
    return text


def _listing(pieces: list[str], mask: list[int], logprobs: list[float]) -> list[Text]:
    """One line per completion token: position, loss mask, sampled logprob, p, the token."""
    lines = [Text(f"{'pos':>6}  mask  {'logprob':>9}  {'p':>6}  token", style="italic")]
    for i, (piece, bit, lp) in enumerate(zip(pieces, mask, logprobs)):
        row = f"{i:>6}  {bit:>4}  {lp:>9.4f}  {math.exp(lp):>6.3f}  {piece!r}"
        lines.append(Text(row, style=(TRAINED if bit else NOT_TRAINED)[0]))
    return lines


def _extended_head(episode: Episode, call: Call) -> int:
    """How many leading prompt tokens repeat the extended call's prompt + completion (0 if none; `Episode`
    validates that they do)."""
    if call.extends_call is None:
        return 0
    earlier = episode.calls[call.extends_call]
    return len(earlier.prompt_ids) + len(earlier.completion_ids)


def _visible(piece: str) -> str:
    """Control characters (other than newline and tab) as \\xNN, so the terminal shows rather than obeys them."""
    return "".join(f"\\x{ord(c):02x}" if (ord(c) < 32 and c not in "\n\t") or ord(c) == 127 else c for c in piece)


def _pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each id decoded alone (special tokens kept); a piece of a multi-byte character shows as U+FFFD."""
    return tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
