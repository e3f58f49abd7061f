"""Supervised fine-tuning on demonstration episodes (JSONL, one Episode per line), resumable.

Run folder: `metrics.jsonl` (one line per step), `checkpoints/step-NNNNNN/` (Hugging Face folder +
trainer state, the newest few kept), `model/` (the final weights). A resumed run restores weights,
optimizer, schedule, RNG and the data cursor from the newest checkpoint and drops the metric lines
logged after it, so the step sequence continues without a gap or a repeat.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from harnessrl.train.checkpoint import latest_checkpoint
from harnessrl.train.config import TrainConfig
from harnessrl.train.trainer import Trainer
from harnessrl.types import Call, Episode, Task, TraceLineError, read_jsonl

__all__ = ["DemonstrationError", "TraceLineError", "demonstration", "read_episodes", "run_sft"]


def read_episodes(path: Path) -> list[Episode]:
    """Every episode of a JSONL file; a bad line raises TraceLineError with its file, line and field."""
    return read_jsonl(path, Episode)


def demonstration(
    tokenizer, messages: list[dict], answer: str, tools: list[dict] | None = None, task: Task | None = None
) -> Episode:
    """A one-turn demonstration episode: the rendered conversation as prompt, `answer` + end of turn as
    the completion, marked `Call.demonstration` (retokenised text, not sampled: RL trains it as guidance, never
    with a ratio against its recorded logprobs of 0)."""
    prompt = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    completion = tokenizer(answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    call = Call(
        prompt_ids=tokenizer(prompt, add_special_tokens=False)["input_ids"], completion_ids=completion,
        sampled_logprobs=[0.0] * len(completion), policy_version=0, demonstration=True,
    )  # fmt: skip
    return Episode(task=task or Task(), calls=[call], status="finished")


def run_sft(
    data: Path,
    out: Path,
    model: str = "tiny",
    config: TrainConfig | None = None,
    epochs: int = 1,
    batch_episodes: int = 16,
    save_every: int = 50,
    resume: bool = False,
    seed: int = 0,
) -> dict[str, float]:
    from harnessrl.policy.model import load_model_and_tokenizer

    episodes = read_episodes(data)
    config = config or TrainConfig(lr=3e-4)
    steps_per_epoch = math.ceil(len(episodes) / batch_episodes)
    total = epochs * steps_per_epoch
    config = config.model_copy(update={"total_steps": total, "seed": seed})
    lm, tokenizer = load_model_and_tokenizer(model, seed=seed)
    _check_demonstrations(episodes, data, lm.get_input_embeddings().num_embeddings, config.mask_agents)
    trainer = Trainer(lm, tokenizer, config, run_dir=out)
    checkpoints = out / "checkpoints"
    cursor = {"epoch": 0, "index": 0}
    if resume:  # from the newest checkpoint, or from the start if the run died before its first one
        if (path := latest_checkpoint(checkpoints)) is not None:
            cursor = trainer.resume(path)
        _truncate_metrics(out / "metrics.jsonl", trainer.step)
    elif (out / "metrics.jsonl").exists():
        raise FileExistsError(f"{out} already holds a run: pass --resume, or choose another --out")

    metrics: dict[str, float] = {}
    with Progress(
        TextColumn("sft"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeRemainingColumn(),
    ) as bar:
        task = bar.add_task("sft", total=total, completed=trainer.step, loss="-")
        while trainer.step < total:
            order = list(range(len(episodes)))
            random.Random(seed * 1_000_003 + cursor["epoch"]).shuffle(order)
            batch = [episodes[i] for i in order[cursor["index"] : cursor["index"] + batch_episodes]]
            epoch = cursor["epoch"]
            cursor = {"epoch": epoch, "index": cursor["index"] + batch_episodes}
            if cursor["index"] >= len(episodes):
                cursor = {"epoch": epoch + 1, "index": 0}
            metrics = trainer.sft_step(batch, {"data/epoch": epoch})
            if "loss/sft" not in metrics:  # a batch without a trainable token: no step (perf/skipped_update)
                continue
            bar.update(task, completed=trainer.step, loss=f"{metrics['loss/sft']:.4f}")
            if trainer.step % save_every == 0 or trainer.step == total:
                trainer.save(checkpoints, cursor)
    _publish(trainer, out / "model")
    return metrics


class DemonstrationError(ValueError):
    """Demonstrations SFT cannot learn from; the message names the file (and the episode)."""


def _check_demonstrations(episodes: list[Episode], data: Path, vocab: int, mask_agents: list[str]) -> None:
    """Refuse what SFT cannot learn from, before any step: no trainable completion anywhere (masked agents' count
    as none), or token ids the model has no embedding for (episodes recorded with another tokenizer)."""
    if not any(c.trainable and c.completion_ids and c.agent not in mask_agents for e in episodes for c in e.calls):
        raise DemonstrationError(f"{data}: no episode has a trainable call with completion tokens: nothing to learn")
    for number, episode in enumerate(episodes, start=1):
        for index, call in enumerate(episode.calls):
            ids = call.prompt_ids + call.completion_ids
            if ids and (min(ids) < 0 or max(ids) >= vocab):  # min / max in C: the scan stays cheap on large data
                bad = next(t for t in ids if not 0 <= t < vocab)
                raise DemonstrationError(
                    f"{data}: episode {number} ({episode.id}), call {index}: token id {bad} is outside the model's "
                    f"vocabulary (0..{vocab - 1}): recorded with another tokenizer?"
                )


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep the metric lines up to `step`: later ones belong to work the checkpoint does not hold."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (json.JSONDecodeError, KeyError):
            break  # a line cut by the kill: everything from here on is lost work
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def _publish(trainer: Trainer, folder: Path) -> None:
    tmp = folder.with_name("." + folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.write_model(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
