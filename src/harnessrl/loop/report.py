"""`harnessrl report --registry DIR`: one page answering "is it improving?" for a production loop.

Each cycle's data counts (episodes, labelled, unlabelled, expired, off-policy share), reward, the
benchmark figures of candidate and current, the paired lower bound, the canaries and the decision;
then every promotion and rollback. A PNG beside the page plots reward and eval over cycles.
"""

from __future__ import annotations

import html
from pathlib import Path

from harnessrl.loop.registry import Registry


def cycle_rows(registry: Registry) -> list[dict]:
    rows = []
    for number, event in enumerate((e for e in registry.events() if e["event"] == "cycle"), start=1):
        figures, decision = event.get("figures", {}), event.get("decision", {})
        counts = figures.get("counts", {})
        rows.append({
            "cycle": number,
            "version": event.get("version") or "-",
            "parent": event.get("parent"),
            "episodes": counts.get("episodes"),
            "labelled": counts.get("labelled_used"),
            "unlabelled": counts.get("unlabelled"),
            "expired": counts.get("expired"),
            "off-policy": counts.get("off_policy_share"),
            "reward": figures.get("reward_mean"),
            "eval current": decision.get("eval_current"),
            "eval candidate": decision.get("eval_candidate"),
            "lower bound": decision.get("paired_lower_bound"),
            "canaries": ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in decision.get("canaries", {}).items()),
            "decision": _decision(decision),
        })  # fmt: skip
    return rows


def _decision(decision: dict) -> str:
    if decision.get("skipped"):
        return "skipped: " + "; ".join(decision.get("reasons", []))
    return "promoted" if decision.get("promote") else "refused: " + "; ".join(decision.get("reasons", []))


def write_registry_report(root: Path, out: Path | None = None) -> Path:
    registry = Registry(root)
    out = out or registry.root / "report.html"
    rows = cycle_rows(registry)
    plot = _plot(rows, out.with_suffix(".png")) if rows else None
    switches = [e for e in registry.events() if e["event"] in ("promote", "rollback")]
    parts = [
        f"<h1>Production loop: {html.escape(registry.name)}</h1>",
        f"<p>promoted: <b>{html.escape(str(registry.promoted()))}</b>; {len(rows)} cycles; "
        f"{len(registry.versions())} versions</p>",
        _table(rows) if rows else "<p>no cycle yet</p>",
        f'<img src="{plot.name}" alt="reward and eval by cycle">' if plot else "",
        "<h2>Promotions and rollbacks</h2>",
        _table([{k: e.get(k) for k in ("event", "version", "previous", "reason")} for e in switches]),
    ]
    style = "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 6px;font:13px sans-serif}"
    out.write_text(f"<!doctype html><meta charset=utf-8><style>{style}</style>" + "\n".join(parts))
    return out


def _table(rows: list[dict]) -> str:
    if not rows:
        return "<p>none</p>"
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = [r["cycle"] for r in rows]
    for key in ("reward", "eval current", "eval candidate"):
        ax.plot(x, [r[key] if r[key] is not None else float("nan") for r in rows], marker="o", label=key)
    for r in rows:
        if r["decision"] == "promoted":
            ax.axvline(r["cycle"], color="green", alpha=0.2)
    ax.set_xticks(x)
    ax.set_xlabel("cycle (green: promoted)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
