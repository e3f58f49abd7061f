"""Pretrain `tiny-base` on the procedural mixture (harnessrl.policy.mixture), resumably.

    python scripts/pretrain_tiny_base.py --out runs/tiny-base [--steps 6000] [--minutes 0] [--resume]
    python scripts/pretrain_tiny_base.py --out runs/tiny-base --export-only   # re-export the newest checkpoint

`--resume` and `--export-only` go on with the run's own settings (size, rate, mixture, seed: `_SAME_RUN`); a flag
given with another value than the run's is refused (`--steps` may grow: the schedule stretches to it).

Starts from the `tiny` architecture and tokenizer (seed 0; `--hidden`/`--layers` pick the size) and
trains next-token loss on rows packed from mixture items (copy, recall, tool_args, record_field,
question_call, entity_call, English prose), with fresh random names in every batch. Items are rendered by the chat
template the model ships with (tools as signature lines, as the gateway renders them) and the loss
falls on the assistant's reply only (prompt tokens are context, not targets: predicting a random
name before it appears teaches nothing); prose is trained on every token. bf16 autocast where the
CPU has it natively (else fp32), AdamW, warmup + cosine. Checkpoints every
`--save-minutes` (Hugging Face folder + optimizer, schedule, step, RNG and mixture state), so an
interrupted run resumes where it stopped. `--minutes` stops early (checkpointed) to continue later.
At the end it probes the model, plots the loss curve and exports fp16 safetensors to
src/harnessrl/policy/tiny_base/ with a README of what was done. Where a GPU is lent, `--device cuda`
runs the steps there and `--workers N` packs batches in N processes (the packing is then the limit;
benchmarks/gpu/pretrain_tiny_base.sh); with workers a resumed run draws fresh items, not the same stream.
"""

from __future__ import annotations

import argparse
import collections
import copy
import itertools
import json
import math
import os
import random
import re
import shutil
import time
from pathlib import Path

import torch

from harnessrl.eval.probe import context_grid, probe, record_grid
from harnessrl.policy import Policy
from harnessrl.policy.mixture import SKILLS, Item, Mixture, render_messages
from harnessrl.policy.tiny import build_tiny
from harnessrl.train.checkpoint import latest_checkpoint, load_state, save_checkpoint, write_atomic
from harnessrl.train.precision import autocast, resolve

WEIGHTS = {
    "copy": 0.1,
    "recall": 0.2,
    "tool_args": 0.15,
    "record_field": 0.3,
    "question_call": 0.15,
    "entity_call": 0.15,
    "list_calls": 0.0,  # v4 was pretrained without it; a stage from v4 adds it with --weights list_calls=W
    "record_chain": 0.0,  # v5 was pretrained without it; --weights record_chain=W adds it
    "prose": 0.1,
}
_SAME_RUN = (  # a resume takes these from the run (--steps may grow: the schedule stretches to it)
    "rows",
    "lr",
    "warmup",
    "hidden",
    "layers",
    "width",
    "seed",
    "init",
    "weights",
    "records_ramp",
    "follow_ups",
    "records",
    "fields",
    "history",
    "teacher",
    "distill",
    "distill_skip",
)
_BOOKKEEPING = (
    "resume",
    "export_only",
    "export_dir",
    "minutes",
    "save_minutes",
    "probe_minutes",
    "probe_items",
    "device",
)
EXPORT = Path(__file__).resolve().parents[1] / "src" / "harnessrl" / "policy" / "tiny_base"


class Packer:
    """Rows of exactly `width` tokens (and their labels: -100 where no loss falls; and 0 / 1: whether a teacher's
    distribution holds the token, 0 for the items of a skill in `skip`) cut from a stream of rendered mixture items."""

    def __init__(self, tokenizer, seed: int, width: int, weights: dict[str, float]):
        self.tokenizer, self.width, self.weights = tokenizer, width, weights
        self.mixture = Mixture(seed)
        self.buffer: list[int] = []
        self.labels: list[int] = []
        self.kept: list[int] = []
        self.skip: set[str] = set()
        self.counts = {k: 0 for k in weights}

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _next(self) -> tuple[list[int], list[int], str]:
        kind = self.mixture.rng.choices(list(self.weights), weights=list(self.weights.values()))[0]
        self.counts[kind] += 1
        if kind == "prose":
            ids = self._encode(self.mixture.prose() + "<|endoftext|>")
            return ids, ids, kind
        return *self.render(self.mixture.item(kind)), kind

    def render(self, item: Item) -> tuple[list[int], list[int]]:
        """An item's ids, and labels that train each of its replies (context: -100)."""
        messages = item.messages + [{"role": "assistant", "content": item.answer}]
        ids, labels, done = [], [], ""
        for turn in (*item.trained, len(messages) - 1):  # every trained reply carries loss, the rest is context
            prompt = render_messages(self.tokenizer, messages[:turn], item.tools, generation_prompt=True)
            full = render_messages(self.tokenizer, messages[: turn + 1], item.tools, generation_prompt=False)
            assert prompt.startswith(done) and full.startswith(prompt), "the chat template must extend its prefixes"
            end = "<|endoftext|>" if turn == len(messages) - 1 else ""
            context, reply = self._encode(prompt[len(done) :]), self._encode(full[len(prompt) :] + end)
            ids += context + reply
            labels += [-100] * len(context) + reply
            done = full
        return ids, labels

    def batch(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids, labels, kept = [], [], []
        for _ in range(rows):
            while len(self.buffer) < self.width:
                more, targets, kind = self._next()
                self.buffer += more
                self.labels += targets
                self.kept += [int(kind not in self.skip)] * len(more)
            ids.append(self.buffer[: self.width])
            labels.append(self.labels[: self.width])
            kept.append(self.kept[: self.width])
            self.buffer, self.labels, self.kept = (x[self.width :] for x in (self.buffer, self.labels, self.kept))
        return torch.tensor(ids), torch.tensor(labels), torch.tensor(kept)

    def state(self) -> dict:
        return {"rng": self.mixture.rng.getstate(), "buffer": self.buffer, "labels": self.labels, "kept": self.kept,
                "counts": self.counts}  # fmt: skip

    def restore(self, state: dict) -> None:
        self.mixture.rng.setstate(state["rng"])
        self.buffer, self.labels = state["buffer"], state["labels"]
        self.kept = state.get("kept", [1] * len(self.labels))  # a run from before --distill-skip
        self.counts = {k: 0 for k in self.weights} | state["counts"]  # a run from before a skill was added


class Stream(torch.utils.data.IterableDataset):
    """The batches of `--workers` processes (a DataLoader takes them in turn, so batch k comes from worker
    k mod W and its records ramp matches the step): each worker packs from its own Mixture, seeded by
    the run's seed, the step it starts at and its number, and sends the items it drew with each batch."""

    def __init__(self, tokenizer, args, weights: dict[str, float], start: int):
        self.tokenizer, self.args, self.weights, self.start = tokenizer, args, weights, start

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        args, seed = self.args, hash((self.args.seed, self.start, worker.id)) % 2**32
        packer = configured(Packer(self.tokenizer, seed, args.width, self.weights), args)
        for step in itertools.count(self.start + worker.id, worker.num_workers):
            before = dict(packer.counts)
            packer.mixture.records = records_for(args, step)
            ids, labels, kept = packer.batch(args.rows)
            yield ids, labels, kept, {k: v - before[k] for k, v in packer.counts.items()}


def configured(packer: Packer, args) -> Packer:
    packer.mixture.follow_ups = args.follow_ups
    packer.mixture.fields = span("--fields", args.fields)
    packer.mixture.history = span("--history", args.history, least=0)
    packer.skip = set(args.distill_skip.split(",")) - {""}
    if unknown := packer.skip - set(WEIGHTS):
        raise SystemExit(f"--distill-skip: unknown skill {sorted(unknown)[0]!r} (one of {', '.join(WEIGHTS)})")
    return packer


def grown(state: dict, old: int, new: int) -> dict:
    """`state` of an `old`-layer model for `new` >= `old` layers by block expansion (LLaMA Pro): the old
    layers in order, with a copy inserted after evenly spaced ones whose attention and MLP output
    projections are zero, so each copy starts as the identity and the grown model computes what the
    old one did."""
    if new < old:
        raise SystemExit(f"--init has {old} layers: --layers {new} cannot shrink it")
    after = [max(0, round((k + 1) * old / (new - old)) - 1) for k in range(new - old)]
    sources = [(i, False) for i in range(old)]
    for i in sorted(after, reverse=True):
        sources.insert(i + 1, (i, True))
    layer = re.compile(r"model\.layers\.(\d+)\.(.+)")
    out = {k: v for k, v in state.items() if not layer.match(k)}
    for j, (i, copy_) in enumerate(sources):
        for key, value in state.items():
            if (m := layer.match(key)) and int(m[1]) == i:
                zero = copy_ and m[2] in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
                out[f"model.layers.{j}.{m[2]}"] = torch.zeros_like(value) if zero else value.clone()
    return out


def records_for(args, step: int) -> tuple[int, int]:
    """Records an item at `step`: `--records` where given, else the ramp's."""
    return span("--records", args.records) if args.records else records_at(step, args.records_ramp)


def records_at(step: int, ramp: int) -> tuple[int, int]:
    """`record_field` curriculum: one or a few records per item during the first `ramp` steps, then
    the probe's 2-5 (finding the field comes before finding the record)."""
    return (2, 5) if step >= ramp else (1, 2 + 3 * step // ramp)


def parse_weights(text: str) -> dict[str, float]:
    """`skill=w,...` over WEIGHTS; unnamed skills keep their default weight."""
    weights = dict(WEIGHTS)
    for part in filter(None, text.split(",")):
        skill, _, value = part.partition("=")
        if skill not in WEIGHTS:
            raise SystemExit(f"--weights: unknown skill {skill!r} (one of {', '.join(WEIGHTS)})")
        try:
            weights[skill] = float(value)
        except ValueError:
            raise SystemExit(f"--weights: {part!r}: expected skill=number, e.g. record_field=0.3") from None
        if not weights[skill] >= 0:
            raise SystemExit(f"--weights: {part!r}: a weight is 0 or more")
    if not sum(weights.values()) > 0:
        raise SystemExit("--weights: every weight is 0: nothing to draw")
    return weights


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/tiny-base"))
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument(
        "--minutes", type=float, default=0, help="stop (checkpointed) after this long; 0 = run to --steps"
    )
    parser.add_argument("--save-minutes", type=float, default=5)
    parser.add_argument("--probe-items", type=int, default=200)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--export-only", action="store_true")
    parser.add_argument("--export-dir", type=Path, default=EXPORT, help="where the shipped checkpoint goes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--probe-minutes", type=float, default=10, help="probe (40 items a skill) this often")
    parser.add_argument(
        "--init", default="", help="start from these weights (a Hugging Face folder; fewer layers are grown)"
    )
    parser.add_argument("--weights", default="", help="mixture weights to change, e.g. record_field=0.5,prose=0.05")
    parser.add_argument("--records-ramp", type=int, default=0, help="record_field curriculum length in steps")
    parser.add_argument(
        "--follow-ups", type=int, default=0, help="record_field drills: up to N more questions on the same records"
    )
    parser.add_argument("--records", default="", help="record_field: records an item, e.g. 2-4 (instead of the ramp)")
    parser.add_argument("--fields", default="2-4", help="record_field: fields a record, e.g. 1-1")
    parser.add_argument("--device", default="cpu", help="where the steps run: cpu, or cuda where a GPU is lent")
    parser.add_argument(
        "--workers", type=int, default=0, help="pack batches in this many processes (0: in the training process)"
    )
    parser.add_argument(
        "--history", default="0", help="earlier copy / recall exchanges before each item, e.g. 0-12: long contexts"
    )
    parser.add_argument(
        "--teacher", default="", help="a model folder whose next-token distribution the run is also held to (--distill)"
    )
    parser.add_argument(
        "--distill", type=float, default=1.0, help="weight of KL(teacher || model) on the trained tokens (--teacher)"
    )
    parser.add_argument(
        "--distill-skip", default="", help="skills whose tokens the teacher does not hold, e.g. record_field,list_calls"
    )
    return parser


def distill_kl(logits: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean KL(teacher || model) over the positions that predict a trained token (labels shifted as the loss's):
    learning without forgetting, the teacher's whole distribution kept where a skill is not being taught."""
    where = labels[:, 1:] != -100
    if not where.any():  # a batch of context only (a long item's first rows)
        return logits.sum() * 0.0
    student = torch.log_softmax(logits[:, :-1][where].float(), -1)
    target = torch.log_softmax(teacher[:, :-1][where].float(), -1)
    return torch.nn.functional.kl_div(student, target, log_target=True, reduction="batchmean")


def pretrained(flag: str, folder: str):
    """The float32 model of a Hugging Face folder; where none loads, an exit naming the flag."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except (OSError, ValueError) as exc:  # no model folder, or not one of ours
        raise SystemExit(f"{flag} {folder}: {str(exc).splitlines()[0]}") from None


def span(flag: str, text: str, least: int = 1) -> tuple[int, int]:
    """`A-B` (or `A`) as (A, B) with `least` <= A <= B."""
    low, _, high = text.partition("-")
    try:
        pair = (int(low), int(high or low))
    except ValueError:
        raise SystemExit(f"{flag}: expected A-B, e.g. 2-4, got {text!r}") from None
    if not least <= pair[0] <= pair[1]:
        raise SystemExit(f"{flag}: expected {least} <= A <= B, got {text!r}")
    return pair


def run_settings(args: argparse.Namespace, saved: dict, parser: argparse.ArgumentParser) -> None:
    """Set `args` to the run's own `_SAME_RUN` settings: a flag left at its default takes the run's value; one given
    with another value is refused (it would not continue the run the checkpoint holds)."""
    for key in _SAME_RUN:
        if key not in saved:  # a run from before the key existed: this invocation's value
            continue
        given = getattr(args, key)
        if given != saved[key] and given != parser.get_default(key):
            raise SystemExit(f"--{key.replace('_', '-')} {given} differs from the run's {saved[key]}")
        setattr(args, key, saved[key])


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.workers < 0:
        raise SystemExit(f"--workers: expected 0 or more, got {args.workers}")
    if args.follow_ups < 0:
        raise SystemExit(f"--follow-ups: expected 0 or more, got {args.follow_ups}")
    if args.export_dir.resolve() in (args.out.resolve(), *args.out.resolve().parents):
        raise SystemExit(f"--export-dir {args.export_dir}: it would hold the run {args.out}, which an export replaces")

    checkpoints, log_path = args.out / "checkpoints", args.out / "log.jsonl"
    state = None
    if args.resume or args.export_only:
        path = latest_checkpoint(checkpoints)
        if path is None:
            raise SystemExit(f"no checkpoint under {checkpoints}")
        state = load_state(path, map_location="cpu")
        run_settings(args, state["args"], build_parser())
    elif latest_checkpoint(checkpoints) is not None:
        raise SystemExit(f"{args.out} holds a run: pass --resume")

    torch.manual_seed(args.seed)
    model, tokenizer = build_tiny(seed=args.seed, hidden=args.hidden, layers=args.layers)
    if args.init and state is None:  # a resumed run's weights are in its checkpoint
        init = pretrained("--init", args.init)
        try:
            model.load_state_dict(grown(init.state_dict(), init.config.num_hidden_layers, args.layers))
        except (ValueError, RuntimeError) as exc:  # another width or vocabulary
            raise SystemExit(f"--init {args.init}: {str(exc).splitlines()[0]}") from None
    model.to(args.device).train()
    teacher = None
    if args.teacher:
        teacher = pretrained("--teacher", args.teacher).to(args.device).eval()
        if teacher.config.vocab_size != model.config.vocab_size:
            raise SystemExit(
                f"--teacher {args.teacher}: vocabulary {teacher.config.vocab_size}, the model's {model.config.vocab_size}"
            )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    packer = configured(Packer(tokenizer, args.seed, args.width, parse_weights(args.weights)), args)
    records_for(args, 0)  # a bad --records is named before any training
    step, wall = 0, 0.0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        packer.restore(state["packer"])
        torch.set_rng_state(state["torch_rng"])
        step, wall = state["step"], state["wall_seconds"]
        if args.export_only:  # the card names the run's own length
            args.steps = state["args"].get("steps", args.steps)
        _truncate(log_path, step)
    elif log_path.exists():  # killed before its first checkpoint: nothing to resume, so it starts over
        log_path.unlink()
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "packer": packer.state(),
                 "torch_rng": torch.get_rng_state(), "step": step, "wall_seconds": wall, "args": vars(args) | {"out": str(args.out)}}  # fmt: skip
        save_checkpoint(
            checkpoints,
            step,
            lambda folder: (model.save_pretrained(folder), tokenizer.save_pretrained(folder)),
            state,
            keep=2,
        )

    if args.workers and not args.export_only:
        stream = Stream(tokenizer, args, packer.weights, step)
        batches = iter(
            torch.utils.data.DataLoader(stream, batch_size=None, num_workers=args.workers, prefetch_factor=8)
        )
    dtype, why = resolve("auto", args.device)
    print(why)
    started, last_save, last_probe = time.monotonic(), time.monotonic(), time.monotonic()
    while step < args.steps and not args.export_only:
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        if args.workers:
            ids, labels, kept, drawn = next(batches)
            packer.counts = {k: packer.counts.get(k, 0) + drawn[k] for k in drawn}
        else:
            packer.mixture.records = records_for(args, step)
            ids, labels, kept = packer.batch(args.rows)
        ids, labels, kept = ids.to(args.device), labels.to(args.device), kept.to(args.device)
        with autocast(dtype, args.device):
            out = model(input_ids=ids, labels=labels)
            loss, kl = out.loss, None
            if teacher is not None:
                with torch.no_grad():
                    taught = teacher(input_ids=ids).logits
                kl = distill_kl(out.logits, taught, labels.masked_fill(kept == 0, -100))
        (loss if kl is None else loss + args.distill * kl).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        seconds = time.perf_counter() - t0
        wall += seconds
        record = {
            "step": step,
            "loss": loss.item(),
            "lr": optimizer.param_groups[0]["lr"],
            "tok_s": ids.numel() / seconds,
            "wall_seconds": wall,
            "precision": dtype,  # per step: a run resumed on another CPU may change it
        }
        if kl is not None:
            record["kl"] = kl.item()
        if time.monotonic() - last_probe > args.probe_minutes * 60:
            record["probe"] = _probe(model, tokenizer, 40, halves=True)
            last_probe = time.monotonic()
            print(json.dumps(record), flush=True)
        elif step % 50 == 0:
            print(json.dumps(record), flush=True)
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if time.monotonic() - last_save > args.save_minutes * 60:
            save()
            last_save = time.monotonic()
        if args.minutes and time.monotonic() - started > args.minutes * 60:
            break
    if not args.export_only:
        save()
    if step >= args.steps or args.export_only:
        export(model, tokenizer, args, step, wall, log_path, packer)


def _probe(model, tokenizer, items: int, halves: bool = False) -> dict[str, float]:
    """The probe; with `halves` also the two halves of `record_field`: finding the record by name (one
    field, three records; chance 1/3) and the field (one record of four fields; chance 1/4), and
    copy, recall and `list_calls` behind 1,024 tokens of earlier conversation."""
    policy = Policy(copy.deepcopy(model).float().cpu().eval(), tokenizer, "tiny-base")
    try:
        scores = probe(policy, items_per_skill=items)
        if halves:
            for fields, records in ((1, 3), (4, 1)):
                scores |= record_grid(policy, items, fields=(fields,), records=(records,))
            scores |= context_grid(policy, items, lengths=(1024,), skills=("copy", "recall", "list_calls"))
        return scores
    finally:
        policy.close()


def where(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else f"{os.cpu_count()}-core CPU"


def _log(path: Path) -> list[dict]:
    """The log's records; a line cut by a kill (the log is appended each step) is left out."""
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _truncate(path: Path, step: int) -> None:
    """The log up to the checkpoint a resume starts from (the steps after it are run again)."""
    if path.exists():
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in _log(path) if r["step"] <= step))


def precisions(records: list[dict]) -> str:
    """How many of the logged steps trained in each precision ("bf16 1200 steps, fp32 300"); logs from before the
    key existed: unknown."""
    counts = collections.Counter(r.get("precision", "unrecorded") for r in records)
    return ", ".join(f"{name} {n} steps" for name, n in counts.most_common()) or "no step logged"


def export(model, tokenizer, args, step: int, wall: float, log_path: Path, packer: Packer) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # the weights as they ship (rounded to fp16), loaded in fp32 as `--model tiny-base` loads them
    scores = _probe(copy.deepcopy(model).half(), tokenizer, args.probe_items)
    records = _log(log_path)
    # written beside, then swapped in: a kill never leaves the target (by default the package's model) half written
    target = args.export_dir
    folder = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    fp16 = copy.deepcopy(model).half().cpu().eval()
    fp16.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot([r["step"] for r in records], [r["loss"] for r in records], linewidth=0.6)
    axis.set(
        xlabel="step",
        ylabel="next-token loss (replies and prose)",
        title=f"tiny-base pretraining ({args.rows}x{args.width} tokens/step)",
    )
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(folder / "loss.png", dpi=120)
    probes = [(r["step"], round(r["wall_seconds"] / 60, 1), r["probe"]) for r in records if "probe" in r]
    probes.append((step, round(wall / 60, 1), scores))
    figure, axis = plt.subplots(figsize=(7, 4))
    for skill in SKILLS:
        axis.plot([m for _, m, _ in probes], [p.get(skill, 0.0) for _, _, p in probes], marker="o", label=skill)
    axis.axhline(0.8, color="grey", linestyle=":", linewidth=0.8)
    axis.set(xlabel=f"minutes of training steps ({where(args.device)})", ylabel="probe accuracy (greedy, exact)", ylim=(0, 1.02),
             title=f"tiny-base probe during pretraining (hidden {args.hidden}, {args.layers} layers)")  # fmt: skip
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(folder / "probe.png", dpi=120)
    (folder / "probe.json").write_text(
        json.dumps({"final": scores, "items_per_skill": args.probe_items, "during": probes}, indent=1)
    )
    (folder / "README.md").write_text(
        _readme(args, step, wall, scores, packer, sum(p.numel() for p in model.parameters()), records)
    )
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    folder.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    print(json.dumps(scores))


def _readme(
    args, step: int, wall: float, scores: dict[str, float], packer: Packer, params: int, records: list[dict]
) -> str:
    table = "\n".join(f"| {s} | {scores[s]:.2f} |" for s in SKILLS)
    total = sum(packer.weights.values())
    mix = ", ".join(f"{k} {v / total:.0%}" for k, v in packer.weights.items())
    counts = packer.counts
    defaults, given = vars(build_parser().parse_args([])), ("out", "steps", "hidden", "layers")
    extra = "".join(  # the other training flags this run changed (bookkeeping flags left out)
        f" --{k.replace('_', '-')} {v}"
        for k, v in vars(args).items()
        if v != defaults[k] and k not in given + _BOOKKEEPING
    )
    return f"""# tiny-base

The `tiny` architecture (Qwen2, {params / 1e6:.1f} M parameters, hidden {args.hidden}, {args.layers} layers, tokenizer of
`tiny`) pretrained on the procedural mixture in `harnessrl/policy/mixture.py`, stored as fp16
safetensors. Load it with `--model tiny-base` or `AutoModelForCausalLM.from_pretrained(<this folder>)`.

Reproduce (resumable; `--resume` after an interruption):

    python scripts/pretrain_tiny_base.py --out runs/tiny-base --steps {args.steps} --hidden {args.hidden} --layers {args.layers}{extra}

- Mixture (items drawn per row, fresh random names and values every time): {mix}.
  Items seen: {json.dumps(counts)}.
- {step} steps x {args.rows} rows x {args.width} tokens = {step * args.rows * args.width / 1e6:.1f} M tokens;
  next-token loss on the assistant's replies and on every prose token; AdamW (0.9, 0.95), weight decay 0.1, peak lr {args.lr}, {args.warmup}
  warmup steps, cosine to 10 %; bf16 autocast where native (else fp32): {precisions(records)}; grad clip 1.0.
- Wall time of the training steps ({where(args.device)}): {wall / 60:.0f} min.
- Loss curve: `loss.png`; probe accuracy against minutes: `probe.png` (and `probe.json`: `during` holds
  [step, minutes, scores] from 40 items a skill; the last entry is the final probe below).

Probe of the fp16 weights as shipped (`harnessrl probe --model tiny-base`, {args.probe_items} fresh items per skill,
greedy, exact match):

| skill | accuracy |
|---|---|
{table}
"""


if __name__ == "__main__":
    random.seed(0)
    main()
