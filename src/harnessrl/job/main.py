"""The main job: base model -> corpus and index -> expert demonstrations -> SFT warm start ->
held-out eval -> RL with the async rollout engine -> held-out eval, all in one run folder.

Run folder: config.yaml (resolved), metrics.jsonl, checkpoints/, demos.jsonl, eval_before.jsonl,
eval_after.jsonl, rewards.png, heldout.png, summary.json.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from pathlib import Path

import yaml

from harnessrl.envs.search import SearchAgent, SearchIndex, context1_reward, load, synthetic
from harnessrl.envs.search.expert import SearchExpert
from harnessrl.eval.heldout import evaluate
from harnessrl.eval.plots import plot_heldout, plot_rewards
from harnessrl.gateway import GatewayClient, create_app
from harnessrl.job.config import JobConfig
from harnessrl.policy import Policy
from harnessrl.rollout import RolloutConfig, RolloutEngine
from harnessrl.train import TrainConfig, Trainer

ADMIN = "harnessrl-job-admin"


def run(config: JobConfig, out: Path, progress: bool = True) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return asyncio.run(_run(config, out, progress))


async def _run(config: JobConfig, out: Path, progress: bool) -> dict:
    started = time.perf_counter()
    random.seed(config.seed)
    if config.data.corpus and config.data.tasks:
        docs, items = load(config.data.corpus, config.data.tasks)
    else:
        docs, items = synthetic(config.data.synthetic_seed)
    train = [t.task() for t in items if t.split == "train"]
    test = [t.task() for t in items if t.split == "test"][: config.eval_tasks]
    index = SearchIndex(docs, out / "index")
    policy = Policy.load(config.model, seed=config.seed)
    gateway = GatewayClient(ADMIN, app=create_app(policy, ADMIN))
    a = config.agent
    agent = SearchAgent(index, a.context_budget, a.max_turns, a.k, a.max_tokens, temperature=1.0)
    greedy = SearchAgent(index, a.context_budget, a.max_turns, a.k, a.max_tokens, temperature=0.0)
    reward = context1_reward()
    try:
        # demonstrations and SFT warm start
        if config.sft.steps:
            demo_engine = RolloutEngine(gateway, SearchExpert(agent, seed=config.seed), reward, RolloutConfig(group_size=2))
            demos = [await demo_engine.episode(t) for t in train for _ in range(config.sft.demos_per_task)]
            (out / "demos.jsonl").write_text("".join(e.to_json() + "\n" for e in demos))
            sft = Trainer(policy.model, policy.tokenizer, TrainConfig(lr=config.sft.lr, schedule="cosine", total_steps=config.sft.steps), run_dir=out, policy=policy)
            rng = random.Random(config.seed)
            for _ in range(config.sft.steps):
                await asyncio.to_thread(sft.sft_step, rng.sample(demos, min(config.sft.batch_episodes, len(demos))))
        # held-out before RL
        before, before_eps = await evaluate(gateway, agent, test)
        before_greedy, _ = await evaluate(gateway, greedy, test)
        _dump(out / "eval_before.jsonl", before_eps)
        # RL
        trainer = Trainer(policy.model, policy.tokenizer, config.rl.train, run_dir=out, policy=policy)
        engine = RolloutEngine(gateway, agent, reward, config.rl.rollout)
        tasks = itertools.cycle(random.Random(config.seed).sample(train, len(train)))
        await engine.train(trainer, tasks, config.rl.updates, progress=progress)
        trainer.save(out / "checkpoints")
        # held-out after RL
        after, after_eps = await evaluate(gateway, agent, test)
        after_greedy, _ = await evaluate(gateway, greedy, test)
        _dump(out / "eval_after.jsonl", after_eps)
    finally:
        await gateway.aclose()
        policy.close()
    summary = {
        "heldout_tasks": len(test),
        "heldout_success_before": before,
        "heldout_success_after": after,
        "heldout_success_greedy_before": before_greedy,
        "heldout_success_greedy_after": after_greedy,
        "rl_updates": config.rl.updates,
        "wall_seconds": time.perf_counter() - started,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if (out / "metrics.jsonl").exists():
        plot_rewards(out / "metrics.jsonl", out / "rewards.png")
    plot_heldout(summary, out / "heldout.png")
    return summary


def _dump(path: Path, episodes) -> None:
    path.write_text("".join(e.to_json() + "\n" for e in episodes))
