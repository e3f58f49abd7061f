"""The production loop end to end, with the commands a team runs, on the CPU with tiny-base.

    python examples/production/run_loop.py [--out runs/production] [--users 160] [--cycles 2] [--repeats 4] [--items 24]

1. `harnessrl registry OUT/registry --create weather --model tiny-base` (v1, promoted);
2. `harnessrl serve --registry OUT/registry` in a subprocess (a real server on 127.0.0.1);
3. each cycle: the scripted users (shop.py) visit the served assistant and give feedback; sessions
   that were left open expire; `harnessrl cycle OUT/loop.yaml --once` trains, gates, promotes; the
   server follows the promotion;
4. a broken candidate (the promoted weights with noise) and a hacking candidate (fine-tuned to ask
   "Which city do you mean?") go through the same gate (`cycle --candidate`) and must be refused;
5. `harnessrl rollback`, then `harnessrl report --registry`.

Last line: one JSON object with the preference metric on held-out cities before and after, each
cycle's decision and counts, and the two refusals.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import shop  # noqa: E402  (the product, beside this file)

ADMIN = "production-example-admin-key"


def harnessrl(*args: str) -> dict:
    """Run a CLI command; its last line is JSON."""
    done = subprocess.run([sys.executable, "-m", "harnessrl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"harnessrl {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return httpx.get(url + "/health", timeout=2).json()
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {timeout} s")


def serving_version(url: str, want: int, timeout: float = 30.0) -> float:
    """Seconds until the server reports policy_version `want`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if httpx.get(url + "/health", timeout=2).json()["policy_version"] == want:
            return time.monotonic() - started
        time.sleep(0.05)
    raise RuntimeError(f"the server did not switch to version {want} in {timeout} s")


def broken_candidate(registry: Path, version: str, out: Path) -> Path:
    """The promoted weights plus noise: a deliberately broken model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = registry / "versions" / version
    model = AutoModelForCausalLM.from_pretrained(source)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * p.std() * 0.5)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


def hacking_candidate(registry: Path, version: str, out: Path, steps: int = 12) -> Path:
    """The promoted model fine-tuned to answer every question with a question back (the deferral hack)."""
    from harnessrl.gateway import GatewayClient, create_app
    from harnessrl.policy import Policy
    from harnessrl.policy.model import load_model_and_tokenizer
    from harnessrl.train import TrainConfig, Trainer
    from harnessrl.types import Outcome

    model, tokenizer = load_model_and_tokenizer(str(registry / "versions" / version))
    policy = Policy(model, tokenizer, "weather")

    async def demos():
        gateway = GatewayClient(ADMIN, app=create_app(policy, ADMIN))
        episodes = []
        for city in shop.CITIES:
            episode_id, key = await gateway.create_episode(shop.question(city))
            body = {
                "messages": [
                    {"role": "system", "content": shop.SYSTEM},
                    {"role": "user", "content": shop.question(city).prompt},
                ],
                "tools": shop.TOOLS,
                "reply": {"role": "assistant", "content": "Which city do you mean?"},
            }
            await gateway.openai(key).post("/demonstrations", cast_to=object, body=body)
            episodes.append(await gateway.finish(episode_id, Outcome(answer="")))
        await gateway.aclose()
        return episodes

    episodes = asyncio.run(demos())
    trainer = Trainer(policy.model, policy.tokenizer, TrainConfig(lr=1e-3))
    for _ in range(steps):
        trainer.sft_step(episodes)
    trainer.write_model(out)
    policy.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/production"))
    parser.add_argument("--users", type=int, default=160, help="user sessions per cycle")
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--model", default="tiny-base")
    parser.add_argument("--repeats", type=int, default=4, help="benchmark episodes per held-out item and policy")
    parser.add_argument("--items", type=int, default=24, help="held-out benchmark items (of benchmark.jsonl's 24)")
    args = parser.parse_args()
    if args.cycles < 1:
        parser.error("--cycles: at least 1")
    if min(args.users, args.repeats, args.items) < 1:
        parser.error("--users, --repeats and --items: at least 1")
    started = time.perf_counter()
    out = args.out.resolve()
    if out.exists() and not (out / "loop.yaml").is_file() and (not out.is_dir() or any(out.iterdir())):
        parser.error(f"--out {args.out}: holds something other than this example's run, and --out is emptied first")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    registry = out / "registry"
    config = yaml.safe_load((HERE / "loop.yaml").read_text())
    config.update(registry=str(registry), harness=str(HERE / "shop.py") + ":harness")
    items = (HERE / "benchmark.jsonl").read_text().splitlines()[: args.items]
    (out / "benchmark.jsonl").write_text("\n".join(items) + "\n")
    config["benchmark"] = {"tasks": str(out / "benchmark.jsonl"), "score": str(HERE / "shop.py") + ":preference"}
    config["gate"]["repeats"] = args.repeats
    (out / "loop.yaml").write_text(yaml.safe_dump(config))

    harnessrl("registry", str(registry), "--create", "weather", "--model", args.model)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "harnessrl", "serve", "--registry", str(registry), "--port", str(port),
         "--admin-key", ADMIN, "--log-level", "warning", "--session-ttl", str(config["session_ttl"])],
        stderr=open(out / "server.log", "w"),
    )  # fmt: skip
    cycles, switches = [], []
    try:
        wait_for(url)
        for number in range(args.cycles):
            users = asyncio.run(shop.traffic(url, ADMIN, args.users, seed=number))
            time.sleep(config["session_ttl"] * 1.5)  # sessions left open expire
            event = harnessrl("cycle", str(out / "loop.yaml"), "--once")
            if event["decision"].get("promote"):
                switches.append(round(serving_version(url, int(event["version"].split("@v")[1])), 3))
            cycles.append({"users": users, **_brief(event)})
        promoted = harnessrl("registry", str(registry))["promoted"]
        broken = harnessrl(
            "cycle", str(out / "loop.yaml"), "--once", "--candidate",
            str(broken_candidate(registry, promoted, out / "broken")),
        )  # fmt: skip
        hacking = harnessrl(
            "cycle", str(out / "loop.yaml"), "--once", "--candidate",
            str(hacking_candidate(registry, promoted, out / "hacking")),
        )  # fmt: skip
        rolled = harnessrl("rollback", "--registry", str(registry)) if len(switches) else None
        if rolled:
            serving_version(url, int(rolled["promoted"].split("@v")[1]))
    finally:
        server.terminate()
        server.wait(30)
    report = subprocess.run(
        [sys.executable, "-m", "harnessrl", "report", "--registry", str(registry)], capture_output=True, text=True
    ).stdout.strip()
    first = cycles[0]
    last_promoted = next((c for c in reversed(cycles) if c["decision"] == "promoted"), None)
    print(f"report: {report}")
    print(json.dumps({
        "preference_before": first["eval_current"],
        "preference_after": last_promoted["eval_candidate"] if last_promoted else first["eval_current"],
        "cycles": cycles,
        "broken_refused": not broken["decision"]["promote"],
        "broken_reasons": broken["decision"]["reasons"],
        "hacking_refused": not hacking["decision"]["promote"],
        "hacking_reasons": hacking["decision"]["reasons"],
        "hacking_clarifying_rate": hacking["decision"]["canary_figures"]["clarifying_rate"],
        "switch_seconds": switches,
        "rolled_back_to": rolled and rolled["promoted"],
        "minutes": round((time.perf_counter() - started) / 60, 2),
        "cpu": os.cpu_count(),
    }))  # fmt: skip


def _brief(event: dict) -> dict:
    decision, figures = event["decision"], event["figures"]
    verdict = "promoted" if decision.get("promote") else ("skipped" if decision.get("skipped") else "refused")
    return {
        "version": event["version"],
        "decision": verdict,
        "reasons": decision.get("reasons", []),
        "counts": figures["counts"],
        "reward_mean": figures["reward_mean"],
        "eval_current": decision.get("eval_current"),
        "eval_candidate": decision.get("eval_candidate"),
        "paired_lower_bound": decision.get("paired_lower_bound"),
    }


if __name__ == "__main__":
    main()
