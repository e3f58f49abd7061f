"""Real episodes for trainer tests: sampled by the tiny policy's engine, scored by a toy rule."""

from __future__ import annotations

import asyncio

from harnessrl.policy import Policy, SamplingParams
from harnessrl.types import Call, Episode, RewardBreakdown, Task

QUESTIONS = ["Name a colour.", "Count to three.", "Say hello.", "Pick a number."]


def sampled_groups(
    policy: Policy,
    groups: int = 2,
    size: int = 4,
    max_tokens: int = 12,
    seed: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> list[list[Episode]]:
    """`groups` tasks x `size` episodes of one sampled turn each; reward = share of the letter 'e'."""

    async def one(task: Task, i: int) -> Episode:
        prompt = policy.encode(policy.render([{"role": "user", "content": task.prompt}], None, True))
        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed * 1000 + i)
        (done,) = await policy.engine.generate(prompt, params)
        text = policy.decode(done.ids, skip_special=True)
        share = text.count("e") / max(len(text), 1)
        call = Call(
            prompt_ids=prompt,
            completion_ids=done.ids,
            sampled_logprobs=done.logprobs,
            policy_version=done.policy_version,
            temperature=temperature,
            top_p=top_p,
        )
        reward = RewardBreakdown(total=share + 0.01 * i, terms={"e_share": share, "index": 0.01 * i})
        return Episode(task=task, calls=[call], reward=reward, status="finished")

    async def run() -> list[list[Episode]]:
        tasks = [Task(id=f"t{g}", prompt=QUESTIONS[g % len(QUESTIONS)]) for g in range(groups)]
        return [list(await asyncio.gather(*(one(t, g * size + i) for i in range(size)))) for g, t in enumerate(tasks)]

    return asyncio.run(run())
