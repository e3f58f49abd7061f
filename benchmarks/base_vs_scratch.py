"""Does pretraining pay? The same short SFT from `tiny-base` and from random init (`tiny`).

    python benchmarks/base_vs_scratch.py [--steps 60] [--train 480] [--test 100]

The task is one neither model saw: dossiers of people (born in / works as / lives on), then a
question about one field of one person; phrasings differ from the pretraining mixture's. Both runs
get the same demonstrations, steps, batch and learning rate; held-out accuracy is greedy exact match
on fresh dossiers. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from harnessrl.argtypes import at_least
from harnessrl.policy import Policy, SamplingParams
from harnessrl.policy.mixture import Mixture
from harnessrl.policy.model import load_model_and_tokenizer
from harnessrl.train import TrainConfig, Trainer
from harnessrl.train.sft import demonstration

FIELDS = {"born": "was born in {v}", "job": "works as a {v}", "street": "lives on {v} street"}
QUESTIONS = {
    "born": "Where was {n} born?",
    "job": "What does {n} do for a living?",
    "street": "On which street does {n} live?",
}


def dossier(mixture: Mixture) -> tuple[list[dict], str]:
    people = []
    for _ in range(mixture.rng.randint(2, 4)):
        people.append({"name": mixture.name(), "born": mixture.name(), "job": mixture.word(), "street": mixture.name()})
    lines = [
        f"Dossier {i + 1}: {p['name']} " + ", ".join(FIELDS[f].format(v=p[f]) for f in FIELDS) + "."
        for i, p in enumerate(people)
    ]
    person, field = mixture.rng.choice(people), mixture.rng.choice(list(FIELDS))
    question = QUESTIONS[field].format(n=person["name"])
    return [{"role": "user", "content": "\n".join(lines) + "\n" + question}], person[field]


def run(model: str, train: list, test: list, steps: int, batch: int, lr: float) -> tuple[float, float]:
    lm, tokenizer = load_model_and_tokenizer(model)
    demos = [demonstration(tokenizer, messages, answer) for messages, answer in train]
    trainer = Trainer(lm, tokenizer, TrainConfig(lr=lr, schedule="cosine", total_steps=steps, warmup_steps=5))
    rng = random.Random(0)
    started = time.perf_counter()
    for _ in range(steps):
        trainer.sft_step(rng.sample(demos, batch))
    seconds = time.perf_counter() - started
    trainer.model.eval()
    policy = Policy(trainer.model, tokenizer, model)

    async def answer(messages: list[dict]) -> str:
        prompt = policy.encode(policy.render(messages, None, True))
        (done,) = await policy.engine.generate(prompt, SamplingParams(temperature=0, max_tokens=16))
        return policy.decode(done.ids, skip_special=True).strip()

    async def evaluate() -> list[str]:
        return await asyncio.gather(*(answer(m) for m, _ in test))

    replies = asyncio.run(evaluate())
    policy.close()
    return sum(r == a for r, (_, a) in zip(replies, test)) / len(test), seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=at_least(1), default=60)
    parser.add_argument("--batch", type=at_least(1), default=16)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--train", type=at_least(1), default=480)
    parser.add_argument("--test", type=at_least(1), default=100)
    parser.add_argument("--base", default="tiny-base", help="the pretrained model to compare with random init")
    args = parser.parse_args()
    if args.batch > args.train:
        parser.error(f"--batch {args.batch}: at most --train ({args.train}), the demonstrations a step samples from")
    train_mix, test_mix = Mixture(seed=424242), Mixture(seed=525252)
    train = [dossier(train_mix) for _ in range(args.train)]
    test = [dossier(test_mix) for _ in range(args.test)]
    results = {}
    for name, model in (("base", args.base), ("scratch", "tiny")):
        accuracy, seconds = run(model, train, test, args.steps, args.batch, args.lr)
        results[name] = accuracy
        print(f"{model}: held-out accuracy {accuracy:.2f} after {args.steps} SFT steps ({seconds:.0f} s)")
    print(json.dumps({"heldout_from_base": results["base"], "heldout_from_scratch": results["scratch"]}))


if __name__ == "__main__":
    main()
