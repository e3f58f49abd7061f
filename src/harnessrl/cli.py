"""`harnessrl` command line. Nothing imports this module."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import typer
from rich.console import Console

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

app = typer.Typer(help="Train LLM agents with RL inside the harness they ship in.", no_args_is_help=True)
console = Console(stderr=True, soft_wrap=True)


@app.callback()
def _main() -> None:
    """harnessrl: gateway, policy and (soon) training."""


@app.command()
def serve(
    model: str = typer.Option("tiny", help="'tiny' (built offline) or a local Hugging Face folder"),
    host: str = typer.Option("127.0.0.1", help="address to bind; anything but loopback exposes the gateway"),
    port: int = typer.Option(8000, help="TCP port"),
    admin_key: str | None = typer.Option(None, envvar="HARNESSRL_ADMIN_KEY", help="admin API key (or HARNESSRL_ADMIN_KEY)"),
    seed: int = typer.Option(0, help="seed for building 'tiny'"),
    max_batch: int = typer.Option(64, help="most sequences decoded in one forward pass"),
    max_request_bytes: int = typer.Option(4 * 1024 * 1024, help="larger request bodies get 413"),
    default_max_tokens: int = typer.Option(512, help="max_tokens when a request gives none"),
    log_level: str = typer.Option("info", help="uvicorn log level; 'info' logs every request"),
) -> None:
    """Serve the policy behind the OpenAI-compatible gateway and record episodes."""
    import uvicorn

    from harnessrl.gateway import create_app

    policy = _load_policy(model, seed, max_batch)
    if admin_key is None:
        admin_key = "hrl-admin-" + secrets.token_urlsafe(18)
        console.print(f"[yellow]no --admin-key or HARNESSRL_ADMIN_KEY; this run's admin key:[/] {admin_key}")
    gateway = create_app(policy, admin_key, max_request_bytes=max_request_bytes, default_max_tokens=default_max_tokens)
    console.print(f"serving [bold]{policy.name}[/] on http://{host}:{port}/v1 (policy_version {policy.version})")
    try:
        uvicorn.run(gateway, host=host, port=port, log_level=log_level)
    finally:
        policy.close()


@app.command("save-model")
def save_model(
    out: Path = typer.Argument(..., help="folder to write (a Hugging Face checkpoint)"),
    model: str = typer.Option("tiny", help="'tiny' or a local Hugging Face folder"),
    seed: int = typer.Option(0, help="seed for building 'tiny'"),
) -> None:
    """Write a model (e.g. the offline `tiny`) as an ordinary Hugging Face folder."""
    policy = _load_policy(model, seed)
    try:
        policy.save(out)
    finally:
        policy.close()
    console.print(f"wrote {policy.name} to {out}")


def _load_policy(model: str, seed: int, max_batch: int = 64):
    from harnessrl.policy import Policy, PolicyLoadError

    try:
        return Policy.load(model, seed=seed, max_batch=max_batch)
    except (PolicyLoadError, OSError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
