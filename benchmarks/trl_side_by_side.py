"""harnessrl vs TRL's GRPOTrainer: the same model, task, sample budget and optimizer, in one run.

    pip install -e '.[bench]'      # trl
    python benchmarks/trl_side_by_side.py [--updates 30] [--prompts 8] [--generations 8] [--max-completion 16] [--lr 2e-5]

Task: `recall` items of the pretraining mixture (key-value lines or fact sentences, then a question
about one key), drawn fresh from a seed neither model saw; reward 1 when the reply, stripped, is
exactly the value, else 0. `tiny-base` gets about half of them right at temperature 1, so the
reward has room to move. The model is the shipped `tiny-base` checkpoint, loaded from its folder
(nothing is downloaded), fp32 on the CPU.

  ours  what a user runs for a single-turn task: RolloutEngine (staleness 0) runs the harness (one
        openai-client chat call per episode) through the in-process gateway, which samples from
        Policy's continuous-batching engine and records the calls; Reward scores each group;
        Trainer.rl_step makes the update and pushes the weights to the policy.
  trl   GRPOTrainer(model=the same checkpoint, reward_funcs=[the same function]) sampling with
        transformers' `generate` (its CPU path: vLLM needs CUDA).

The same on both sides: the prompts, in the same order (their token ids are checked equal); P
prompts x G samples per update, one optimizer step per batch, no batch reused; temperature 1,
top_p 1, no top_k; the max completion length; group-normalised advantages; a PPO-clip loss with
clip range [0.8, 1.28] summed over every completion token of the batch and divided by their count
(harnessrl `aggregation: token` = TRL `loss_type: dapo`); no KL term; torch AdamW at a constant
learning rate, betas (0.9, 0.999), no weight decay; grad-norm clip 1.0; fp32; no gradient
checkpointing. Both are on-policy, so the ratio is 1 at the step and the clip never bites. Where
they differ: harnessrl's `dynamic_sampling` (drop groups whose rewards are all equal) is turned off,
so such groups count in the token normaliser at advantage 0, as in TRL; TRL's group std is
Bessel-corrected with eps 1e-4, ours is the population std with eps 1e-6 (advantages differ by a
factor sqrt(G / (G - 1)), which Adam mostly absorbs); our trainer splits micro-batches at
`token_budget` padded tokens and runs each group's prompt once, its G completions against the
prompt's keys and values (the same loss and gradients), TRL's batch is one forward of every
prompt + completion.

The two take turns, one update each (TRL runs in a thread that waits at each step's start), so a
change in the machine's load hits both alike and neither runs while the other is timed. Seconds per
update: ours, one `engine.train(trainer, tasks, 1)` call (rollouts through the gateway, scoring,
update, weight push); TRL, from the start of its step to the start of the next (generation,
scoring, loss, optimizer step, logging, fetching the next batch); the median over updates.
trl_time_over_ours = TRL's median / ours. Reward reached: the mean reward of the samples of the last
`--last` updates (each batch is sampled by the weights before its update), the same for both;
reward_start_* is the same over the first `--last` updates. Update i draws the same prompts on both
sides, so the trajectories are paired, but a batch holds only P x G samples: differences of a few
hundredths are noise. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import openai
import torch
from rich import progress as bar
from transformers.utils import logging as hf_logging

from harnessrl.argtypes import at_least
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.policy import Policy
from harnessrl.policy.mixture import Item, Mixture
from harnessrl.policy.model import load_model_and_tokenizer
from harnessrl.rewards import Reward, weighted
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.train import TrainConfig, Trainer
from harnessrl.types import Episode, Outcome, Task

ADMIN = "bench-admin-key"
MODEL = "tiny-base"
EPS_LOW, EPS_HIGH, GRAD_CLIP = 0.2, 0.28, 1.0


@dataclass
class Run:
    """Per update: wall seconds, the part of them spent sampling (until the rewards are
    in), and the mean reward of the update's batch."""

    seconds: list[float] = field(default_factory=list)
    sampling: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)

    def status(self) -> str:
        s, sampling, r = self.seconds[-1], self.sampling[-1], self.rewards[-1]
        return f"{s:.2f} s/update ({sampling:.2f} sampling), reward {r:.3f}"


class Turns:
    """Ours and TRL alternate, one update each. TRL runs in a thread and hands the turn over
    at the start of each of its steps; it ends its run by handing it over for good."""

    def __init__(self) -> None:
        self.ours, self.trl = threading.Semaphore(0), threading.Semaphore(0)
        self.trl_run: Future | None = None
        self.stopped = False

    async def ours_begin(self) -> None:
        await asyncio.to_thread(self.ours.acquire)
        if self.trl_run.done():  # TRL stopped early: its error, or say so
            self.trl_run.result()
            raise RuntimeError("the TRL side ended before ours")

    def ours_end(self) -> None:
        self.trl.release()

    def trl_begin(self) -> None:
        self.ours.release()
        self.trl.acquire()
        if self.stopped:
            raise RuntimeError("stopped: the harnessrl side failed")

    def stop_trl(self) -> None:
        self.stopped = True
        self.trl.release()


def exact(reply: str, answer: str) -> float:
    """The reward both sides use: 1 when the stripped reply is the value, else 0."""
    return float(reply.strip() == answer)


def _items(n: int, seed: int) -> list[Item]:
    mixture = Mixture(seed)
    return [mixture.item("recall") for _ in range(n)]


# ---- ours: rollout engine + gateway + trainer ---------------------------------------


async def run_ours(items: list[Item], args, bars: bar.Progress, turns: Turns) -> Run:
    size = args.prompts * args.generations
    policy = Policy.load(MODEL, max_batch=size)
    gateway = GatewayClient(ADMIN, app=create_app(policy, ADMIN))

    async def harness(task: Task, llm: openai.AsyncOpenAI) -> Outcome:
        r = await llm.chat.completions.create(
            model=MODEL,
            messages=task.data["messages"],
            max_tokens=args.max_completion,
            temperature=1.0,
            top_p=1.0,
        )
        return Outcome(answer=r.choices[0].message.content or "")

    def exact_term(e: Episode) -> float:
        return exact(e.outcome.answer, e.task.data["answer"])

    config = RolloutConfig(
        group_size=args.generations,
        groups_per_update=args.prompts,
        staleness=0,
        concurrency=size,
    )
    reward = Reward([weighted("exact", exact_term)])
    engine = RolloutEngine(gateway, harness, reward, config)
    train_config = TrainConfig(
        lr=args.lr,
        eps_low=EPS_LOW,
        eps_high=EPS_HIGH,
        aggregation="token",
        dynamic_sampling=False,  # as TRL: all-equal groups stay, at advantage 0
        grad_clip=GRAD_CLIP,
        seed=args.seed,
    )
    trainer = Trainer(policy.model, policy.tokenizer, train_config, policy=policy)
    tasks = iter([
        Task(id=f"recall-{i}", data={"messages": it.messages, "answer": it.answer})
        for i, it in enumerate(items)
    ])  # fmt: skip
    job = bars.add_task("ours", total=args.updates, status="")
    run = Run()
    # staleness 0: N calls of one update each are one call of N updates
    for _ in range(args.updates):
        await turns.ours_begin()
        started = time.perf_counter()
        (metrics,) = await engine.train(trainer, tasks, 1, progress=False)
        run.seconds.append(time.perf_counter() - started)
        turns.ours_end()
        # episodes through the gateway, scored
        run.sampling.append(metrics["perf/rollout_wait_seconds"])
        run.rewards.append(metrics["reward/mean"])
        bars.update(job, advance=1, status=run.status())
    await gateway.aclose()
    policy.close()
    return run


# ---- TRL: GRPOTrainer ---------------------------------------------------------------


def run_trl(items: list[Item], args, bars: bar.Progress, turns: Turns) -> Run:
    try:
        from datasets import Dataset
        from transformers import PrinterCallback, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        raise SystemExit(f"TRL is missing ({exc}): pip install -e '.[bench]'") from None

    model, tokenizer = load_model_and_tokenizer(MODEL)
    rows = [{"prompt": it.messages, "answer": it.answer} for it in items]
    run, clock = Run(), {}

    def exact_reward(prompts, completions, answer, **_) -> list[float]:
        # called once per update, right after generation
        run.sampling.append(time.perf_counter() - clock["step"])
        scores = [exact(c[0]["content"], a) for c, a in zip(completions, answer)]
        run.rewards.append(sum(scores) / len(scores))
        return scores

    job = bars.add_task("trl", total=args.updates, status="")

    class Timer(TrainerCallback):
        """An update runs from its step's start to the next step's start (or the end)."""

        def _stop(self) -> None:
            if "step" in clock:
                run.seconds.append(time.perf_counter() - clock["step"])
                bars.update(job, advance=1, status=run.status())

        def on_step_begin(self, *_, **__):
            self._stop()
            turns.trl_begin()
            clock["step"] = time.perf_counter()

        def on_train_end(self, *_, **__):
            self._stop()

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, report_to="none", use_cpu=True, bf16=False, fp16=False,
            disable_tqdm=True, logging_steps=1, save_strategy="no", seed=args.seed,
            # one optimizer step per P x G batch, used once, prompts in dataset order
            per_device_train_batch_size=args.prompts * args.generations,
            gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
            num_generations=args.generations, max_steps=args.updates, shuffle_dataset=False,
            max_completion_length=args.max_completion, temperature=1.0, top_p=1.0, top_k=0,
            # the same loss and optimizer as ours
            loss_type="dapo", scale_rewards="group", epsilon=EPS_LOW, epsilon_high=EPS_HIGH,
            beta=0.0, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
            optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.999, weight_decay=0.0,
            max_grad_norm=GRAD_CLIP, activation_checkpointing=False,
        )  # fmt: skip
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[exact_reward],
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[Timer()],
        )
        # its log lines would break the progress display
        trainer.remove_callback(PrinterCallback)
        with warnings.catch_warnings():
            # TRL calls a transformers method deprecated in 5.x; nothing for us to change
            warnings.filterwarnings("ignore", "`is_gradient", FutureWarning)
            trainer.train()
    return run


def _check_same_prompts(items: list[Item]) -> None:
    """The gateway's prompt ids and TRL's (apply_chat_template, tokenize=True) must be
    the same tokens."""
    policy, tokenizer = Policy.load(MODEL), load_model_and_tokenizer(MODEL)[1]
    for it in items:
        ours = policy.encode(policy.render(it.messages, None, generation_prompt=True))
        theirs = tokenizer.apply_chat_template(
            it.messages,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        if ours != list(theirs):
            raise SystemExit(f"gateway and TRL prompt ids differ for {it.messages!r}")
    policy.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=at_least(1), default=30)
    parser.add_argument("--prompts", type=at_least(1), default=8, help="groups per update")
    parser.add_argument("--generations", type=at_least(2), default=8, help="group size")
    parser.add_argument("--max-completion", type=at_least(1), default=16, help="tokens")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--last", type=at_least(1), default=5, help="updates averaged")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    items = _items(args.prompts * args.updates, seed=771_000 + args.seed)
    _check_same_prompts(items)

    columns = (
        bar.TextColumn("{task.description:>4}"),
        bar.BarColumn(),
        bar.MofNCompleteColumn(),
        bar.TextColumn("{task.fields[status]}"),
        bar.TimeElapsedColumn(),
    )
    turns, runs = Turns(), {}

    def trl_side() -> Run:
        try:
            return run_trl(items, args, progress, turns)
        finally:
            turns.ours.release()

    with bar.Progress(*columns) as progress, ThreadPoolExecutor(1, "trl") as pool:
        turns.trl_run = pool.submit(trl_side)
        try:
            runs["ours"] = asyncio.run(run_ours(items, args, progress, turns))
        except BaseException:
            turns.stop_trl()
            raise
        runs["trl"] = turns.trl_run.result()

    last = min(args.last, args.updates)
    median = {k: statistics.median(r.seconds) for k, r in runs.items()}
    sampling = {k: statistics.median(r.sampling) for k, r in runs.items()}
    start = {k: statistics.mean(r.rewards[:last]) for k, r in runs.items()}
    reached = {k: statistics.mean(r.rewards[-last:]) for k, r in runs.items()}
    for k, r in sorted(runs.items()):
        trajectory = " ".join(f"{x:.2f}" for x in r.rewards)
        print(
            f"{k:<5} {median[k]:.2f} s/update, {sampling[k]:.2f} s of it sampling "
            f"(medians; total {sum(r.seconds):.0f} s); reward {start[k]:.3f} -> "
            f"{reached[k]:.3f}; per update: {trajectory}"
        )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); {MODEL}, fp32; {args.prompts} prompts x "
        f"{args.generations} samples x <= {args.max_completion} tokens per update, "
        f"{args.updates} updates, lr {args.lr}; reward = mean of the first / last {last} updates"
    )
    print(json.dumps({
        "trl_time_over_ours": round(median["trl"] / median["ours"], 2),
        "reward_ours": round(reached["ours"], 3),
        "reward_trl": round(reached["trl"], 3),
        "reward_start_ours": round(start["ours"], 3),
        "reward_start_trl": round(start["trl"], 3),
        "seconds_per_update_ours": round(median["ours"], 2),
        "seconds_per_update_trl": round(median["trl"], 2),
        "sampling_seconds_ours": round(sampling["ours"], 2),
        "sampling_seconds_trl": round(sampling["trl"], 2),
        "updates": args.updates,
        "samples_per_update": args.prompts * args.generations,
        "max_completion": args.max_completion,
        "lr": args.lr,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
