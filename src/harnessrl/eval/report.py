"""`harnessrl report`: one static HTML page of a run's curves and summary, or of two runs side by side.

Reads RUN/metrics.jsonl (one line per trainer update, as train/trainer.py and the rollout engine
write it), and RUN/sft/metrics.jsonl, RUN/validation.jsonl and RUN/summary.json (the main job's SFT
phase, its validation by update and its held-out numbers) when there are. The PNGs
(eval/plots.py) go into a folder named after the page, next to it (report.html -> report/), and
the page refers to them relatively, so the pair can be copied anywhere. A panel whose keys no run
logged is listed on the page as missing rather than drawn empty.

It knows metric keys and files; it knows nothing about models or training.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from harnessrl.eval.plots import HELDOUT, RUN_STYLES, SMOOTH, as_number, plot_curves, plot_heldout_runs


class ReportError(ValueError):
    """A run folder that cannot be reported on; the message names the file (and line)."""


@dataclass(frozen=True)
class Panel:
    name: str  # the PNG's file name, without .png
    title: str
    ylabel: str
    keys: tuple[str, ...] = ()  # exact keys, in this order
    prefix: str = ""  # or every key with this prefix ...
    exclude: tuple[str, ...] = ()  # ... but these
    phase: Literal["rl", "sft", "validation"] = "rl"
    log: bool = False
    only_when_logged: bool = False  # a feature's panel (the swarm's): not listed as missing in runs without it
    smooth: int = 0  # the first key's trailing mean over this many updates beside it (plot_curves)

    def pick(self, present: set[str]) -> list[str]:
        if self.prefix:
            picked = [k for k in present if k.startswith(self.prefix)]
            keys = [k for k in picked if k not in self.exclude]
            return sorted(keys, key=lambda k: (k != "reward/mean", k))  # the mean first
        return [k for k in self.keys if k in present]

    def describe(self) -> str:
        return f"{self.prefix}*" if self.prefix else ", ".join(self.keys)


# fmt: off
RATIOS = tuple(f"policy/{w}_{s}" for w in ("ratio", "is_weight") for s in ("mean", "min", "max"))
PANELS = [
    Panel("success", "training batches: success and malformed calls", "share of the batch's episodes", keys=("rollout/success", "rollout/malformed_share"), smooth=SMOOTH),
    Panel("reward", "reward and its terms", "reward", prefix="reward/", exclude=("reward/std", "reward/max"), smooth=SMOOTH),
    Panel("terms", "reward terms before weighting (at weight 0 too)", "value", prefix="term/", only_when_logged=True),
    Panel("hacking", "hacking flags", "share of the batch's episodes flagged", prefix="hacking/"),
    Panel("entropy", "policy entropy on loss tokens", "nats", keys=("policy/entropy",)),
    Panel("clip", "clip fractions", "share of loss tokens", keys=("policy/clip_frac_low", "policy/clip_frac_high", "policy/is_weight_capped")),
    Panel("ratios", "importance ratios", "ratio", keys=RATIOS),
    Panel("staleness", "staleness: current version - sampling version", "policy versions", keys=("policy/staleness",)),
    Panel("logprob_gap", "train/sample logprob gap", "mean |log pi_train - log pi_sampled|", keys=("policy/logprob_gap",), log=True),
    Panel("kl", "KL to the initial weights", "KL", keys=("policy/kl",)),
    Panel("loss", "policy loss", "loss", keys=("loss/policy",)),
    Panel("sft_loss", "SFT loss", "loss", keys=("loss/sft",), phase="sft"),
    Panel("sft_names", "SFT: probability of the demonstrated tool's name (where the agent decides)", "mean p of its tokens", keys=("sft/name_p",), phase="sft", only_when_logged=True),
    Panel("validation", "validation: the train tasks set aside (best/ holds summary.json's chosen_update)", "mean score", prefix="validation/", phase="validation", only_when_logged=True),
    Panel("hops_success", "training batches: success by gold documents per task", "share", prefix="hops/success_", only_when_logged=True),
    Panel("hops_calls", "training batches: model calls per episode by gold documents per task", "calls", prefix="hops/calls_", only_when_logged=True),
    Panel("swarm", "swarm: delegation and completion", "share", keys=("swarm/spawn_rate", "swarm/finish_rate"), only_when_logged=True),
    Panel("swarm_steps", "swarm: steps per episode", "steps", keys=("swarm/critical_steps", "swarm/total_steps", "swarm/assigned", "swarm/unfinished"), only_when_logged=True),
    Panel("swarm_lambdas", "PARL auxiliary weights (annealed to 0)", "lambda", keys=("swarm/lambda_parallel", "swarm/lambda_finish"), only_when_logged=True),
    Panel("alarms", "alarms (1 = tripped)", "alarm", prefix="alarm/", only_when_logged=True),
]
# fmt: on


@dataclass
class Run:
    folder: Path
    label: str
    # RL and SFT updates, each in the order metrics.jsonl logged them
    rl: list[dict[str, Any]] = field(default_factory=list)
    sft: list[dict[str, Any]] = field(default_factory=list)
    validation: list[dict[str, Any]] = field(default_factory=list)  # {update, validation/METRIC} per validated update
    summary: dict[str, Any] | None = None  # summary.json, when the run has one


NUMBERS = ("perf/skipped_update", "update")  # keys the page counts or plots by: a number where present


def read_metrics(path: Path, required: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every non-blank line of a metrics.jsonl (or validation.jsonl), or ReportError naming the first bad line:
    not a JSON object, a `required` key missing, a NUMBERS key not a number. A last line without its newline
    that does not parse is skipped, as the job drops it: an append in progress, or cut by a kill."""
    # the last: "" after a whole line, else one without its newline
    lines = _text(path).split("\n")
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise ReportError(f"{path}: line {number}: not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(row, dict):
            raise ReportError(f"{path}: line {number}: not a JSON object")
        if missing := [k for k in required if k not in row]:
            raise ReportError(f"{path}: line {number}: '{missing[0]}' missing")
        for key in NUMBERS:
            if key in row and not math.isfinite(as_number(row[key])):
                raise ReportError(f"{path}: line {number}: '{key}' is {json.dumps(row[key])}, not a number")
        rows.append(row)
    if not rows:
        raise ReportError(f"{path}: no metric lines")
    return rows


def _text(path: Path) -> str:
    """A file's text, or ReportError naming the line that is not UTF-8 (a damaged file: the job writes ASCII JSON)."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ReportError(f"{path}: line {line}: not UTF-8") from None


def load_run(folder: Path, label: str) -> Run:
    if not folder.is_dir():
        raise ReportError(f"{folder}: no such run folder")
    metrics = folder / "metrics.jsonl"
    sft = folder / "sft" / "metrics.jsonl"  # the main job's SFT phase logs apart
    if not metrics.is_file() and not sft.is_file():
        raise ReportError(f"{metrics}: missing; a run folder holds one line per trainer update")
    rows = [row for path in (metrics, sft) if path.is_file() for row in read_metrics(path)]
    run = Run(folder, label)
    for row in rows:  # rl_step always logs rollout/groups; sft_step never does
        rl = "rollout/groups" in row or "loss/policy" in row
        (run.rl if rl else run.sft).append(row)
    if (validation := folder / "validation.jsonl").is_file():  # the job's: {update, success | item_f1, ...}
        run.validation = [
            {"update": r["update"]} | {f"validation/{k}": r[k] for k in ("success", "item_f1") if k in r}
            for r in read_metrics(validation, required=("update",))
        ]
    path = folder / "summary.json"
    if path.is_file():
        try:
            run.summary = json.loads(_text(path))
        except json.JSONDecodeError as exc:
            raise ReportError(f"{path}: line {exc.lineno}: not JSON ({exc.msg})") from None
        if not isinstance(run.summary, dict):
            raise ReportError(f"{path}: not a JSON object")
        for key in ("heldout_by_gold_docs", "heldout_by_family"):  # plots.py draws a bar group per entry
            if run.summary.get(key) is not None and not isinstance(run.summary[key], dict):
                raise ReportError(f"{path}: '{key}' is {json.dumps(run.summary[key])}, not a JSON object")
    return run


DESKTOP = ("Thumbs.db", "desktop.ini")  # what a file browser leaves in a folder it showed (and .DS_Store, a dotfile)


def write_report(folders: list[Path], out: Path | None = None) -> Path:
    """Write the page (default FOLDER/report.html) and its PNGs; returns the page's path."""
    out = out or folders[0] / "report.html"
    images = out.parent / out.stem
    if out.suffix != ".html" or out.is_dir():  # the PNG folder is the page's name less .html
        raise ReportError(f"--out {out}: give a file name ending in .html (its PNGs go in a folder named after it)")
    # a run folder (a job's own heldout.png is beside its summary.json), a model (RUN/best.html -> RUN/best/), any
    # folder of other files: the page's PNGs would land among them, overwriting same-named ones
    listed = images.iterdir() if images.is_dir() else ()
    others = [p.name for p in listed if p.suffix != ".png" and not p.name.startswith(".") and p.name not in DESKTOP]
    if images.resolve() in [f.resolve() for f in folders]:
        raise ReportError(f"--out {out}: its PNGs would go in the run folder {images}/; name the page otherwise")
    if others:
        held = f"{', '.join(sorted(others)[:3])}{', ...' if len(others) > 3 else ''}"
        raise ReportError(f"--out {out}: its PNGs would go in {images}/, which holds {held}; name the page otherwise")
    if len({f.resolve() for f in folders}) < len(folders):  # one label, one curve: the page would show a single run
        raise ReportError(f"{' and '.join(map(str, folders))}: the same run folder twice; give another run, or one")
    labels = [f.name or str(f) for f in folders]
    if len(set(labels)) < len(labels):
        labels = [str(f) for f in folders]
    runs = [load_run(f, label) for f, label in zip(folders, labels)]
    images.mkdir(parents=True, exist_ok=True)
    named = len(runs) > 1  # one run: legends show bare keys
    figures: list[tuple[str, str, str]] = []  # (title, png name, what it shows)
    missing: list[Panel] = []
    summaries = {r.label if named else "": r.summary for r in runs if r.summary}
    if any(k in s for s in summaries.values() for g in HELDOUT for k in g[1:]):
        plot_heldout_runs(summaries, images / "heldout.png")
        figures.append(
            (
                "held-out success",
                "heldout.png",
                "summary.json: "
                + ", ".join(k for g in HELDOUT for k in g[1:])
                + "".join(
                    f", {k}"
                    for k in ("heldout_by_gold_docs", "heldout_by_family")
                    if any(k in s for s in summaries.values())
                ),
            )
        )
    for panel in PANELS:
        rows = {r.label if named else "": getattr(r, panel.phase) for r in runs}
        keys = panel.pick({k for phase_rows in rows.values() for row in phase_rows for k in row})
        if not keys:
            if not panel.only_when_logged:
                missing.append(panel)
            continue
        plot_curves(
            rows,
            keys,
            images / f"{panel.name}.png",
            panel.title,
            panel.ylabel,
            panel.log,
            x="update" if panel.phase == "validation" else None,
            smooth=panel.smooth,
        )
        figures.append((panel.title, f"{panel.name}.png", ", ".join(keys)))
    out.write_text(_page(runs, figures, missing, images.name), encoding="utf-8")
    return out


# ---- the page ---------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 72em; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.7em; text-align: right; font-variant-numeric: tabular-nums; }
th:first-child, td:first-child { text-align: left; font-family: monospace; }
figure { margin: 1.5em 0; } img { max-width: 100%; } figcaption, .note { color: #666; font-size: 0.9em; }
"""


def _page(
    runs: list[Run],
    figures: list[tuple[str, str, str]],
    missing: list[Panel],
    images: str,
) -> str:
    esc = html.escape
    title = "harnessrl report: " + " vs ".join(r.label for r in runs)
    parts = [
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title><style>{_CSS}</style></head><body>'
    ]
    parts.append(f"<h1>{esc(title)}</h1>")
    if len(runs) > 1:
        styles = ", ".join(
            f"{esc(r.label)}: <code>{RUN_STYLES[i % len(RUN_STYLES)]}</code>" for i, r in enumerate(runs)
        )
        parts.append(f"<p class=note>Curves of both runs share each plot; line styles: {styles}.</p>")
    parts.append("<h2>Summary</h2>" + _table(runs))
    for r in runs:
        if r.summary is None:
            parts.append(
                f"<p class=note>No summary.json in <code>{esc(str(r.folder))}</code>: no held-out numbers for {esc(r.label)}.</p>"
            )
    parts.append(
        "<h2>Curves</h2><p class=note>x axis: updates in the order metrics.jsonl logged them; SFT updates only in the SFT panel.</p>"
    )
    for caption, png, keys in figures:
        src = quote(f"{images}/{png}")
        parts.append(
            f'<figure><img src="{src}" alt="{esc(caption)}"><figcaption>{esc(caption)} ({esc(keys)})</figcaption></figure>'
        )
    if missing:
        items = "".join(f"<li>{esc(p.title)} (<code>{esc(p.describe())}</code>)</li>" for p in missing)
        parts.append(
            f"<h2>Not in metrics.jsonl</h2><p class=note>No run logged these keys, so they are not plotted:</p><ul>{items}</ul>"
        )
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _table(runs: list[Run]) -> str:
    rows: dict[str, list[Any]] = {
        "RL updates": [len(r.rl) for r in runs],
        "SFT updates": [len(r.sft) for r in runs],
        "skipped updates": [sum(int(row.get("perf/skipped_update", 0)) for row in r.rl + r.sft) for r in runs],
        "reward/mean, first update": [_first_last(r.rl, "reward/mean")[0] for r in runs],
        "reward/mean, last update": [_first_last(r.rl, "reward/mean")[1] for r in runs],
    }
    flat = [_flat(r.summary or {}) for r in runs]
    for numbers in flat:
        for key in numbers:
            rows.setdefault(key, [f.get(key) for f in flat])
    head = "<tr><th></th>" + "".join(f"<th>{html.escape(r.label)}</th>" for r in runs) + "</tr>"
    body = "".join(
        f"<tr><td>{html.escape(k)}</td>" + "".join(f"<td>{_cell(v)}</td>" for v in vs) + "</tr>"
        for k, vs in rows.items()
    )
    return f"<table>{head}{body}</table>"


def _flat(summary: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects (e.g. phase_seconds) as dotted keys: phase_seconds.sft."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _first_last(rows: list[dict[str, Any]], key: str) -> tuple[Any, Any]:
    values = [row[key] for row in rows if key in row]
    return (values[0], values[-1]) if values else (None, None)


def _cell(value: Any) -> str:
    if value is None:
        return "&mdash;"
    if isinstance(value, list):  # names (heldout_alarms; [] = none raised) or an interval [low, high]
        if all(isinstance(v, str) for v in value):
            return html.escape(", ".join(value)) if value else "none"
        return "[" + ", ".join(map(_cell, value)) + "]"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return html.escape(str(value))
