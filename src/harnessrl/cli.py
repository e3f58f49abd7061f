"""`harnessrl` command line. Nothing imports this module."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Literal

import typer
from rich.console import Console
from rich.text import Text

from harnessrl.policy.toolformat import ToolFormatName

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

app = typer.Typer(help="Train LLM agents with RL inside the harness they ship in.", no_args_is_help=True)
# no markup: what is printed holds paths and messages ("runs[exp1]/..."), which markup would mangle or refuse
console = Console(stderr=True, soft_wrap=True, markup=False)
MODEL_HELP = "'tiny', 'tiny-base', 'tiny-base-long', a preset (smollm2-135m-instruct), a local Hugging Face folder or a .gguf file"
# uvicorn.config.LOG_LEVELS' keys, spelled out so that `--help` need not import uvicorn
UvicornLogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
TOOL_FORMAT_HELP = "how tools are shown and calls read back: auto (from the chat template) | hermes | llama3_json"


@app.callback()
def _main() -> None:
    """harnessrl: gateway, policy and (soon) training."""


@app.command()
def serve(
    model: str | None = typer.Option(None, help=MODEL_HELP + "; default tiny"),
    tool_format: ToolFormatName = typer.Option("auto", help=TOOL_FORMAT_HELP),
    host: str = typer.Option("127.0.0.1", help="address to bind; anything but loopback exposes the gateway"),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port; 0 = any free one"),
    admin_key: str | None = typer.Option(
        None, envvar="HARNESSRL_ADMIN_KEY", help="admin API key (or HARNESSRL_ADMIN_KEY)"
    ),
    seed: int = typer.Option(0, help="seed for building 'tiny'"),
    max_batch: int = typer.Option(64, min=1, help="most sequences decoded in one forward pass"),
    max_request_bytes: int = typer.Option(4 * 1024 * 1024, min=1, help="larger request bodies get 413"),
    default_max_tokens: int = typer.Option(512, min=1, help="max_tokens when a request gives none"),
    log_level: UvicornLogLevel = typer.Option("info", help="uvicorn log level; 'info' logs every request"),
    frozen: list[str] = typer.Option(
        [],
        help="NAME=MODEL (a frozen copy in process: tiny-base, a preset, a folder, a .gguf) or "
        "NAME=http://HOST/v1#UPSTREAM (proxied; key from HARNESSRL_FROZEN_API_KEY); requests with model NAME "
        "go there and are recorded untrainable. Repeatable.",
    ),
    frozen_cache: int = typer.Option(
        0, min=0, help="greedy completions each pinned --frozen model keeps: identical greedy requests share one"
    ),
    registry: Path | None = typer.Option(
        None, help="serve the promoted version of this model registry and follow promotions (instead of --model)"
    ),
    store: str | None = typer.Option(
        None,
        help="trace store (SQLAlchemy URL or SQLite path): every call committed before it is answered; "
        "default REGISTRY/traces.db with --registry, none otherwise",
    ),
    session_ttl: float | None = typer.Option(
        None,
        min=0.0,
        help="seconds an episode may stay idle before it is expired (failed, counted); 0 = never; "
        "default 3600 with --registry, never otherwise",
    ),
    vllm_url: str | None = typer.Option(
        None,
        help="generate on this vLLM server (started on the same weights, docs/distributed.md) instead of in process",
    ),
    prefix_cache: int = typer.Option(
        0,
        min=0,
        help="tokens of finished requests' KV kept to prefill a later prompt that starts the same (an agent's next "
        "turn), per in-process model; 0 = off; reported as usage.prompt_tokens_details.cached_tokens",
    ),
) -> None:
    """Serve the policy behind the OpenAI-compatible gateway and record episodes."""
    import uvicorn

    from harnessrl.gateway import create_app
    from harnessrl.gateway.models import Pinned, parse_frozen

    if admin_key is not None and len(admin_key) < 8:  # before any model loads
        raise typer.BadParameter("must be at least 8 characters", param_hint="--admin-key")
    try:
        frozen_models = dict(parse_frozen(spec, tool_format, frozen_cache) for spec in frozen)
    except ValueError as exc:  # FrozenSpecError, PolicyLoadError
        raise typer.BadParameter(str(exc), param_hint="--frozen") from None
    if prefix_cache and vllm_url:
        raise typer.BadParameter(
            "vLLM caches prefixes itself (its --enable-prefix-caching)", param_hint="--prefix-cache"
        )
    background, recorder = [], None
    if registry is not None:
        from harnessrl.loop.serve import follow

        if model is not None or vllm_url is not None:
            _fail("--registry serves its promoted version in process: drop --model and --vllm-url")
        reg = _registry(registry)
        if (promoted := reg.promoted()) is None:
            _fail(f"{registry}: nothing promoted yet (harnessrl promote VERSION --registry {registry})")
        try:
            policy = reg.load(promoted, max_batch, tool_format, prefix_cache)
        except Exception as exc:  # a damaged version folder: safetensors', transformers' or the template's error
            _fail(f"{registry}: the promoted version {promoted} does not load ({type(exc).__name__}: {exc}); "
                  f"roll back (harnessrl rollback --registry {registry}) or promote another version")  # fmt: skip
        background.append(follow(reg, promoted, max_batch, tool_format, prefix_cache))
        store = store or str(registry / "traces.db")
        session_ttl = 3600.0 if session_ttl is None else session_ttl
    else:
        policy = _load_policy(model or "tiny", seed, max_batch, tool_format, vllm_url)
    pinned = [m.policy for m in frozen_models.values() if isinstance(m, Pinned)]
    if policy.name in frozen_models:  # the name is known once the policy is loaded
        for loaded in (policy, *pinned):
            loaded.close()
        raise typer.BadParameter(
            f"{policy.name!r} is the trainable policy's name: give the frozen model another", param_hint="--frozen"
        )
    for served in (policy, *pinned):
        served.engine.prefix_cache = prefix_cache  # (a version the registry swaps in gets it from follow())
    if store is not None:
        from harnessrl.loop import Store

        try:
            recorder = Store(store)
        except (ValueError, OSError) as exc:
            _fail(f"--store: {exc}")
        console.print(f"recording every call to {recorder.url}")
    if admin_key is None:
        admin_key = "hrl-admin-" + secrets.token_urlsafe(18)
        console.print(
            Text.assemble(("no --admin-key or HARNESSRL_ADMIN_KEY; this run's admin key:", "yellow"), f" {admin_key}")
        )
    gateway = create_app(
        policy,
        admin_key,
        max_request_bytes=max_request_bytes,
        default_max_tokens=default_max_tokens,
        frozen=frozen_models,
        recorder=recorder,
        session_ttl=session_ttl,
        background=background,
    )
    config = uvicorn.Config(gateway, host=host, port=port, log_level=log_level)
    sock = config.bind_socket()  # bound here so that with --port 0 the line below names the port it got
    port = sock.getsockname()[1]
    console.print(f"serving {policy.name} on http://{host}:{port}/v1 (policy_version {policy.version})")
    for name in frozen_models:
        console.print(f"  frozen {name}: requests with model {name!r}, recorded untrainable")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        gateway.state.serving.policy.close()
        if recorder is not None:
            recorder.close()


@app.command()
def probe(
    ctx: typer.Context,
    model: str = typer.Option("tiny-base", help=MODEL_HELP),
    tool_format: ToolFormatName = typer.Option("auto", help=TOOL_FORMAT_HELP),
    items: int = typer.Option(200, min=1, help="fresh items per skill"),
    seed: int = typer.Option(1_000_003, help="seed of the probe items (pretraining never uses it)"),
    record_grid: bool = typer.Option(
        False, "--record-grid", help="record_field only, by fields per record x records shown (items per cell)"
    ),
    context: str = typer.Option(
        "",
        help="comma-separated lengths, e.g. 0,512,1024: every skill behind an earlier conversation of at least "
        "that many tokens (items per cell)",
    ),
    temperature: float = typer.Option(
        0.0, min=0.0, help="0: greedy; above 0: one seeded sample an item, as RL's rollouts draw (T = 1)"
    ),
    decisions: Path | None = typer.Option(
        None,
        help="episodes (JSONL, e.g. a run's demos.jsonl): instead of the skills, the probability the model gives "
        "each recorded call's tool name, per task family and call number",
    ),
) -> None:
    """Copying / tool-use probe: accuracy per skill; the last line is one JSON object."""
    import json

    from harnessrl.eval import probe as probes
    from harnessrl.eval.inspect import NotThisTokenizer
    from harnessrl.types import Episode, TraceLineError, read_jsonl

    given = _given(ctx, "items", "seed", "record_grid", "context", "temperature")
    if decisions is not None and given:
        _fail(f"{', '.join(given)}: for the skill probes, not with --decisions (it scores the recorded calls)")
    if record_grid and context:
        _fail("--record-grid and --context are two grids: give one")
    try:
        lengths = [int(n) for n in context.split(",")] if context else []
        bad = any(n < 0 for n in lengths)
    except ValueError:
        bad = True
    if bad:
        raise typer.BadParameter(
            f"{context!r}: comma-separated token counts of 0 or more, e.g. 0,512,1024", param_hint="--context"
        )
    episodes = None
    if decisions is not None:
        try:
            episodes = read_jsonl(decisions, Episode)
        except (TraceLineError, OSError) as exc:  # missing, a folder, unreadable
            _fail(f"--decisions: {exc}")
    policy = _load_policy(model, 0, tool_format=tool_format)
    try:
        if episodes is not None:
            try:
                found = probes.decisions(policy, episodes)
            except NotThisTokenizer as exc:
                _fail(f"--decisions {decisions}: {exc}")
        elif record_grid:
            scores = probes.record_grid(policy, items=items, seed=seed, temperature=temperature)
        elif lengths:
            scores = probes.context_grid(policy, items=items, seed=seed, lengths=lengths, temperature=temperature)
        else:
            scores = probes.probe(policy, items_per_skill=items, seed=seed, temperature=temperature)
    finally:
        policy.close()
    if episodes is not None:
        for key, row in found.items():
            console.print(f"{key:>44}: p {row['p']:.3f}  n {row['n']}")
        print(json.dumps(found))
        return
    for skill, accuracy in scores.items():
        console.print(f"{skill:>22}: {accuracy:.3f}")
    print(json.dumps(scores))


@app.command("judge-calibrate")
def judge_calibrate(
    episodes: Path = typer.Option(..., help="labelled episodes (JSONL): outcome.success is the verifiable label"),
    judge: Path = typer.Option(..., help="judge config, JSON or YAML: base_url, model, rubric, api_key_env, ..."),
) -> None:
    """A judge's agreement with verifiable outcomes: accuracy, Spearman, position bias. Last line: JSON."""
    import asyncio
    import json

    from pydantic import ValidationError
    from rich.table import Table

    from harnessrl.rewards import Judge, JudgeConfig
    from harnessrl.rewards.calibrate import calibrate
    from harnessrl.types import Episode, TraceLineError, read_jsonl, read_yaml, validated

    try:
        config = validated(JudgeConfig, read_yaml(judge), judge)
        report = asyncio.run(calibrate(Judge(config), read_jsonl(episodes, Episode)))
    except (TraceLineError, ValidationError, ValueError, OSError) as exc:
        _error(exc)
        raise typer.Exit(2) from exc
    table = Table("metric", "value", title=f"judge {config.model} @ {config.base_url}")
    for key, value in report.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    console.print(table)
    print(json.dumps(report))


@app.command("save-model")
def save_model(
    out: Path = typer.Argument(..., help="folder to write (a Hugging Face checkpoint)"),
    model: str = typer.Option("tiny", help=MODEL_HELP),
    seed: int = typer.Option(0, help="seed for building 'tiny'"),
) -> None:
    """Write a model (e.g. the offline `tiny`) as an ordinary Hugging Face folder."""
    if out.exists() and not out.is_dir():  # transformers would log an error and write nothing
        _fail(f"{out}: a file, not a folder; give a folder to write the model to")
    if (out / "config.json").exists():  # a model (a run's best/, a checkpoint): its weights would be replaced
        _fail(f"{out} already holds a model (config.json): choose another folder, or remove it first")
    policy = _load_policy(model, seed)
    try:
        policy.save(out)
    finally:
        policy.close()
    console.print(f"wrote {policy.name} to {out}")


@app.command()
def train(
    ctx: typer.Context,
    config: Path | None = typer.Argument(None, help="YAML job config; none = the embedded default"),
    corpus: Path | None = typer.Option(None, help="corpus.jsonl: {id, text, title?} per line"),
    tasks: Path | None = typer.Option(None, help="tasks.jsonl: {id, question, answer, gold_doc_ids, split} per line"),
    out: Path = typer.Option(Path("runs/main"), help="run folder"),
    model: str | None = typer.Option(None, help=MODEL_HELP + "; default the config's model: (tiny-base)"),
    tool_format: ToolFormatName | None = typer.Option(
        None, help=TOOL_FORMAT_HELP + "; default the config's tool_format:"
    ),
    resume: Path | None = typer.Option(
        None,
        help="continue this run folder with its own config.yaml: finished phases are kept, SFT and RL go on from their newest checkpoint",
    ),
    warm_start: Path | None = typer.Option(
        None,
        help="a finished search run whose demonstrations, SFT weights and eval before this run copies, so only RL and "
        "the eval after run (to compare RL configs on one warm start); the config must agree with the run's outside "
        "rl, reward, prefix_cache, loggers, budget_seconds and sft.budget_share (and in rl.validation_tasks, fresh_tasks, "
        "train.lora)",
    ),
) -> None:
    """The main job: SFT warm start from expert demonstrations, RL on the search agent, held-out eval before and after
    (with `swarm:` in the config, the swarm job: an orchestrator over frozen search sub-agents, docs/swarm.md;
    with `code:`, the coding job: bug fixes judged by hidden tests in a sandbox, docs/code.md)."""
    import json

    from pydantic import ValidationError

    from harnessrl.job import code, main, swarm
    from harnessrl.job.config import JobConfig

    def job_module(job: JobConfig):
        return swarm if job.swarm else code if job.code else main

    try:
        if resume is not None:
            if any(x is not None for x in (config, corpus, tasks, model, tool_format, warm_start)) or _given(
                ctx, "out"
            ):
                raise ValueError(
                    "--resume continues a run with its own config.yaml, in its own folder: give no CONFIG, --corpus, "
                    "--tasks, --model, --tool-format, --warm-start or --out"
                )
            job = JobConfig.load_run(resume)
            out, summary = resume, job_module(job).resume(resume)
        else:
            job = JobConfig.load(config)
            if (corpus is None) != (tasks is None):
                raise ValueError("--corpus and --tasks go together")
            if corpus is not None:
                job.data.corpus, job.data.tasks = corpus, tasks
            job.model, job.tool_format = model or job.model, tool_format or job.tool_format
            if warm_start is not None:
                if job_module(job) is not main:
                    raise ValueError("--warm-start is for the search job (a config without swarm: or code:)")
                summary = main.from_warm_start(job, out, warm_start)
            else:
                summary = job_module(job).run(job, out)  # refused where out holds a run with another config
    except (ValidationError, ValueError, OSError) as exc:  # DataError, TraceLineError are ValueErrors
        _error(exc)
        raise typer.Exit(2) from exc
    console.print(f"run folder: {out}")
    print(json.dumps(summary))


@app.command("make-corpus")
def make_corpus(
    out: Path = typer.Argument(..., help="folder for corpus.jsonl and tasks.jsonl"),
    generator: str = typer.Option(
        "people",
        help="people (short entries: people, towns, countries; the job's default) or voyages (ships, ports and rivers, facts inside paragraphs of prose)",
    ),
    seed: int = typer.Option(0, help="generator seed"),
    people: int | None = typer.Option(
        None, min=4, help="people in the people corpus, one question each (default 120; the main job's corpus: 340)"
    ),
    force: bool = typer.Option(False, help="overwrite corpus.jsonl and tasks.jsonl where the folder holds them"),
) -> None:
    """Write a synthetic search corpus and its tasks as JSONL, for `harnessrl train --corpus --tasks`."""
    from harnessrl.envs.search import GENERATORS, write_corpus

    if generator not in GENERATORS:
        _fail(f"--generator: {generator!r} is not one of {', '.join(GENERATORS)}")
    if out.exists() and not out.is_dir():
        _fail(f"{out}: a file, not a folder; give a folder for corpus.jsonl and tasks.jsonl")
    if not force and (held := [n for n in ("corpus.jsonl", "tasks.jsonl") if (out / n).exists()]):
        _fail(f"{out} already holds {' and '.join(held)}: choose another folder, or pass --force to overwrite")
    if people is not None and generator != "people":
        _fail(f"--people: the {generator} generator has no people")
    try:
        docs, tasks = GENERATORS[generator](seed, **({} if people is None else {"people": people}))
    except ValueError as exc:  # more people than names
        _fail(f"--people: {exc}")
    try:
        corpus_path, tasks_path = write_corpus(out, docs, tasks)
    except OSError as exc:  # a file where a parent folder should be, no permission
        _fail(f"{out}: {exc}")
    splits = {s: sum(t.split == s for t in tasks) for s in ("train", "test")}
    console.print(
        f"wrote {len(docs)} documents to {corpus_path} and {splits['train']} train / {splits['test']} test tasks to {tasks_path}"
    )


@app.command("eval")
def eval_command(
    env: str = typer.Option(..., help="environment: search"),
    checkpoint: str = typer.Option(
        ...,
        help="a Hugging Face folder, a run folder (a job's: its best/), its checkpoints/ (newest step), or 'tiny-base'",
    ),
    split: str = typer.Option("test", help="train | test"),
    repeats: int = typer.Option(1, help="episodes per task"),
    temperature: float = typer.Option(1.0, help="sampling temperature; 0 = greedy"),
    config: Path | None = typer.Option(
        None,
        help="job YAML: agent settings (context_budget, max_turns, ...), data, rollout timeout; default: the config.yaml of the run the checkpoint is in, if any",
    ),
    corpus: Path | None = typer.Option(None, help="corpus.jsonl: {id, text, title?} per line; default the job's data"),
    tasks: Path | None = typer.Option(None, help="tasks.jsonl: {id, question, answer, gold_doc_ids, split} per line"),
    out: Path = typer.Option(Path("runs/eval"), help="folder for eval.json, eval.md, episodes.jsonl"),
    concurrency: int = typer.Option(32, help="episodes in flight at once"),
    seed: int = typer.Option(0, help="torch seed for sampling"),
    tool_format: ToolFormatName | None = typer.Option(None, help=TOOL_FORMAT_HELP + "; default the job config's"),
    baseline: Path | None = typer.Option(
        None,
        help="episodes of the same tasks evaluated before (an eval's episodes.jsonl, a job's eval_before.jsonl): "
        "adds gain_vs_baseline, the success gain paired by task with its 95% interval",
    ),
) -> None:
    """Run a harness on every task of a split N times: each metric's mean and 95% CI. Last line: JSON."""
    import json

    from pydantic import ValidationError
    from rich.table import Table

    from harnessrl.eval.evaluate import EvalRequest, evaluate
    from harnessrl.job.config import JobConfig

    try:
        run = None if config else _run_folder(checkpoint)
        job = JobConfig.load_run(run) if run else JobConfig.load(config)
        job.tool_format = tool_format or job.tool_format
        try:
            request = EvalRequest(
                env=env, split=split, checkpoint=checkpoint, repeats=repeats, temperature=temperature,
                concurrency=concurrency, seed=seed, corpus=corpus, tasks=tasks, job=job, baseline=baseline,
            )  # fmt: skip
        except ValidationError as exc:
            _fail(_flag_error(exc))
        report = evaluate(request, out)
    except (
        ValidationError,
        ValueError,
        OSError,
    ) as exc:  # CheckpointError, PolicyLoadError, DataError, TraceLineError are ValueErrors
        _error(exc)
        raise typer.Exit(2) from exc
    title = f"{env}/{split}: {report['tasks']} tasks x {report['repeats']} = {report['episodes']} episodes, {report['model']}"
    table = Table("metric", "mean", "95% CI", title=title, caption=report["ci"]["method"])
    for name, m in report["metrics"].items():
        table.add_row(name, f"{m['mean']:.4g}", f"[{m['low']:.4g}, {m['high']:.4g}]")
    console.print(table)
    if g := report.get("gain_vs_baseline"):
        console.print(f"against {g['baseline']} ({g['tasks']} tasks): success {g['success_before']:.3f} -> "
                      f"{g['success_after']:.3f}, gain 95% CI {g['ci']}")  # fmt: skip
    console.print(f"written: {out / 'eval.json'}, {out / 'eval.md'}, {out / 'episodes.jsonl'}")
    print(json.dumps(report))


@app.command()
def sft(
    data: Path = typer.Option(..., help="demonstration episodes, one Episode JSON per line"),
    out: Path = typer.Option(..., help="run folder: metrics.jsonl, checkpoints/, model/"),
    model: str = typer.Option("tiny", help=MODEL_HELP + " to start from"),
    epochs: int = typer.Option(1, min=1),
    batch_episodes: int = typer.Option(16, min=1, help="episodes per optimizer step"),
    lr: float = typer.Option(3e-4, help="AdamW learning rate"),
    schedule: str = typer.Option(
        "cosine",
        help="constant | linear | cosine (decay to 0 at the last step) | wsd (constant, then linear to 0 over the last 20 %)",
    ),
    name_weight: float = typer.Option(
        1.0, min=0, help="loss weight of the tokens that write a called tool's name (where the agent decides)"
    ),
    token_budget: int = typer.Option(8192, help="padded tokens per micro-batch"),
    lora: bool = typer.Option(False, help="train LoRA adapters (peft) instead of all weights"),
    precision: str = typer.Option("auto", help="auto (bf16 where the CPU has it natively, else fp32) | bf16 | fp32"),
    save_every: int = typer.Option(50, min=1, help="checkpoint every N steps (and at the end)"),
    resume: bool = typer.Option(False, help="continue the run in --out from its newest checkpoint"),
    seed: int = typer.Option(0),
) -> None:
    """Supervised fine-tuning on demonstration episodes, with the RL trainer's masks."""
    from pydantic import ValidationError

    from harnessrl.policy import PolicyLoadError
    from harnessrl.train import LoraConfig, TrainConfig
    from harnessrl.train.sft import DemonstrationError, TraceLineError, run_sft

    try:
        config = TrainConfig(
            lr=lr,
            schedule=schedule,
            name_weight=name_weight,
            token_budget=token_budget,
            precision=precision,
            lora=LoraConfig() if lora else None,
        )
    except ValidationError as exc:
        _fail(_flag_error(exc))
    try:
        metrics = run_sft(data, out, model, config, epochs, batch_episodes, save_every, resume, seed)
    except (TraceLineError, DemonstrationError, PolicyLoadError, ValidationError, OSError) as exc:  # OSError: --data
        _error(exc)
        raise typer.Exit(2) from exc
    console.print(
        f"sft done: step {metrics.get('step')}, loss {metrics.get('loss/sft', float('nan')):.4f}; model in {out / 'model'}"
    )


@app.command()
def report(
    run: Path | None = typer.Argument(
        None, help="run folder: metrics.jsonl (and sft/metrics.jsonl, summary.json when the main job wrote them)"
    ),
    other: Path | None = typer.Argument(
        None, help="a second run folder, drawn on the same plots and tabled side by side"
    ),
    out: Path | None = typer.Option(
        None, help="the HTML page; default RUN/report.html, PNGs in a folder beside it named after it (RUN/report/)"
    ),
    registry: Path | None = typer.Option(
        None, help="a model registry: one page of its cycles (data counts, reward, eval, decision); DIR/report.html"
    ),
) -> None:
    """One static HTML page: reward and its terms, held-out success, entropy, clip fractions, ratios, staleness, logprob gap, hacking flags."""
    from harnessrl.eval.report import ReportError, write_report

    if registry is not None:
        if run is not None:
            _fail("--registry draws a registry's page: give no RUN folder with it")
        from harnessrl.loop.registry import RegistryError
        from harnessrl.loop.report import write_registry_report

        if out is not None and out.suffix != ".html":  # as a run's page: never over a file that is not a page
            _fail(f"--out {out}: an .html file")
        try:
            print(write_registry_report(_registry(registry).root, out))
        except (RegistryError, OSError) as exc:
            _fail(str(exc))
        return
    if run is None:
        _fail("give a RUN folder, or --registry DIR")
    try:
        page = write_report([run] if other is None else [run, other], out)
    except (ReportError, OSError) as exc:
        _error(exc)
        raise typer.Exit(2) from exc
    print(page)


@app.command("inspect")
def inspect_episode(
    episode: str = typer.Argument(..., help="a JSONL file of episodes, or (with --run) the id of an episode"),
    index: int | None = typer.Option(None, help="which episode of the file, from 0 (default: the first)"),
    episode_id: str | None = typer.Option(None, "--id", help="the episode of the file with this id"),
    run: Path | None = typer.Option(
        None,
        help="run folder whose *.jsonl files (demos, eval_before, eval_after, rollouts/update-N, ...) are searched, in path order, for EPISODE as an id",
    ),
    model: str = typer.Option("tiny-base", help="whose tokenizer decodes the ids: " + MODEL_HELP),
    logprobs: bool = typer.Option(
        False, help="also list every completion token: position, loss mask, sampled logprob, p"
    ),
) -> None:
    """One episode token by token: call boundaries, prompt (dim), completion green where trained and red where not (the trainer's own mask)."""
    from pydantic import ValidationError

    from harnessrl.calltree import lineages
    from harnessrl.eval.inspect import check_vocabulary, embedding_rows, load_episode, load_tokenizer, render

    try:
        chosen = load_episode(episode, run, index, episode_id)
        lineages(chosen.calls)  # a call tree that does not hold (CallTreeError) is named before anything is drawn
        tokenizer = load_tokenizer(model)
        check_vocabulary(chosen, tokenizer, embedding_rows(model))
    except (
        ValidationError,
        ValueError,
        OSError,
    ) as exc:  # TraceLineError, EpisodeNotFound, PolicyLoadError, CallTreeError, NotThisTokenizer are ValueErrors
        _error(exc)
        raise typer.Exit(2) from exc
    render(chosen, tokenizer, Console(soft_wrap=True, highlight=False), logprobs)


@app.command()
def sandbox(
    command: list[str] = typer.Argument(..., help="the command and its arguments (after --)"),
    workspace: Path = typer.Option(..., help="the directory it runs in and the only one it may write"),
    timeout: float = typer.Option(30.0, help="wall-clock seconds before the whole process tree is killed"),
    cpu_seconds: int = typer.Option(30, help="CPU-time limit"),
    memory_mb: int = typer.Option(1024, help="address-space (and cgroup memory) limit"),
    processes: int = typer.Option(64, help="most processes at once (pids cgroup)"),
    file_mb: int = typer.Option(64, min=1, help="largest file the command may write (RLIMIT_FSIZE)"),
    workspace_mb: int | None = typer.Option(
        None,
        min=1,
        help="cap what a run adds to the workspace, as the coding harness does (256 MiB): past it, the files the "
        "run wrote or changed are removed, largest first, and disk_full is true; unset: unchecked (nothing removed)",
    ),
) -> None:
    """Run one command exactly as the coding harness does: no network, writes only in WORKSPACE, limits, tree kill.

    Prints the command's output, then one JSON line: exit_code, timed_out, survivors, guards, disk_full."""
    import json
    import sys

    from harnessrl.envs.code import sandbox as box

    try:
        limits = box.Limits(wall_seconds=timeout, cpu_seconds=cpu_seconds, memory_mb=memory_mb, processes=processes,
                            file_mb=file_mb, workspace_mb=workspace_mb)  # fmt: skip
        result = box.run(command, workspace, limits)
    except (FileNotFoundError, ValueError) as exc:
        _error(exc)
        raise typer.Exit(2) from exc
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.stdout and not result.stdout.endswith("\n"):  # the JSON stays a line of its own: the last
        sys.stdout.write("\n")
    print(json.dumps(result.summary()))
    raise typer.Exit(0 if result.exit_code == 0 else 1)


def _run_folder(checkpoint: str) -> Path | None:
    """The run folder a checkpoint lies in: the folder itself or up to 3 above, holding a config.yaml beside what a
    job writes (phases.json, or its checkpoints): a project's own config.yaml above a model folder is not a run's."""
    folder = Path(checkpoint)
    if not folder.is_dir():  # 'tiny-base', or a path that is not there
        return None
    for candidate in [folder, *folder.resolve().parents][:4]:
        marks = ("phases.json", "checkpoints", "best", "sft")
        if (candidate / "config.yaml").is_file() and any((candidate / m).exists() for m in marks):
            return candidate
    return None


def _load_policy(model: str, seed: int, max_batch: int = 64, tool_format: str = "auto", vllm_url: str | None = None):
    from harnessrl.policy import Policy, PolicyLoadError
    from harnessrl.policy.vllm import SyncError

    try:
        return Policy.load(model, seed=seed, max_batch=max_batch, tool_format=tool_format, vllm_url=vllm_url)
    except SyncError as exc:  # names the server and what it answered
        _error(f"--vllm-url: {exc}")
        raise typer.Exit(2) from exc
    except (PolicyLoadError, OSError) as exc:
        _error(exc)
        raise typer.Exit(2) from exc


# ---- the production loop (docs/production.md) -------------------------------------------------


def _given(ctx: typer.Context, *names: str) -> list[str]:
    """The flags among `names` (parameter names) typed on the command line: an explicit default counts too."""
    return [f"--{n.replace('_', '-')}" for n in names if ctx.get_parameter_source(n).name == "COMMANDLINE"]


def _flag_error(exc) -> str:
    """A pydantic ValidationError of a model built from a command's flags, as `--flag: message` (its first error)."""
    first = exc.errors()[0]
    if not first["loc"]:  # a model validator's message names its flags itself
        return first["msg"].removeprefix("Value error, ")
    return f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}"


def _error(message: object) -> None:
    console.print(Text.assemble(("error:", "red"), f" {message}"))


def _fail(message: str) -> None:
    _error(message)
    raise typer.Exit(2)


def _registry(folder: Path):
    from harnessrl.loop.registry import Registry, RegistryError

    try:
        return Registry(folder)
    except RegistryError as exc:
        _fail(str(exc))


@app.command("registry")
def registry_command(
    folder: Path = typer.Argument(..., help="the registry folder"),
    create: str | None = typer.Option(None, help="create the registry for model NAME (with --model)"),
    model: str | None = typer.Option(
        None, help="add a version made from this model and promote it if none is: " + MODEL_HELP
    ),
    seed: int = typer.Option(0, help="seed for building 'tiny'"),
) -> None:
    """Show a model registry's versions, decisions and figures; --create NAME --model M starts one."""
    from rich.table import Table

    from harnessrl.loop.registry import Registry, RegistryError
    from harnessrl.policy import PolicyLoadError  # from policy/sources.py: no torch

    try:
        reg = Registry.create(folder, create) if create else Registry(folder)
        if model is not None:
            with reg.lock():
                have = reg.versions()
                version = next((v.id for v in have if v.source == model), None)
                if create and have and version is None:
                    raise RegistryError(f"{reg.root}: --create: the registry exists and holds {have[-1].id}; "
                                        f"to add a version from {model}, drop --create")  # fmt: skip
                if create and have:  # the command that started it, run again: nothing to add
                    console.print(f"{reg.name} exists: {version} is from {model}; nothing added")
                else:
                    version = reg.add_model(model, seed).id
                    console.print(f"added {version} from {model}")
                if reg.promoted() is None:  # also a first run's, killed before it promoted
                    reg.promote(version, reason=f"first version, from {model}")
    except (RegistryError, PolicyLoadError, OSError) as exc:
        _fail(str(exc))
    try:  # a version.json cut short or edited by hand: named
        promoted, versions, events = reg.promoted(), reg.versions(), reg.events()
    except RegistryError as exc:
        _fail(str(exc))
    table = Table(title=f"registry {reg.name} ({reg.root})")
    for column in ("version", "parent", "source / window", "reward", "eval cand/cur", "lower bound", "decision"):
        table.add_column(column)
    # a cycle's line holds its final decision (version.json has the gate's: PROMOTED may have moved meanwhile)
    logged = {e["version"]: e["decision"] for e in events if e["event"] == "cycle" and e.get("version")}
    for v in versions:
        d, f = logged.get(v.id, v.decision), v.figures
        window = Path(v.source).name if v.source else f"{f.get('counts', {}).get('labelled_used')} episodes"
        failed = ", ".join(_reason_label(r) for r in d.get("reasons", []))
        verdict = "added" if d.get("added") else ("passed" if d.get("promote") else "refused: " + failed)
        table.add_row(
            ("* " if v.id == promoted else "  ") + v.id,
            v.parent or "",
            window,
            "" if f.get("reward_mean") is None else str(f["reward_mean"]),
            f"{d.get('eval_candidate', '')}/{d.get('eval_current', '')}" if "eval_current" in d else "",
            str(d.get("paired_lower_bound", "")),
            verdict,
        )
    Console(width=160, markup=False).print(table)  # reasons in full: version.json, events.jsonl, report --registry
    print(json.dumps({"name": reg.name, "promoted": promoted, "versions": [v.id for v in reg.versions()]}))


def _reason_label(reason: str) -> str:
    """A cycle's reason in a word or two (cycle.py and gate.py write them); in full in version.json and events.jsonl."""
    if reason.startswith("canary "):
        return reason.removeprefix("canary ").removesuffix(" failed")
    labels = {
        "paired lower bound": "bound",
        "the candidate finished": "min_finished",
        "PROMOTED moved": "PROMOTED moved",
    }
    return next((label for start, label in labels.items() if reason.startswith(start)), reason)


@app.command()
def promote(
    version: str = typer.Argument(..., help="NAME@vN, vN or N"),
    registry: Path = typer.Option(..., help="the registry folder"),
    reason: str = typer.Option("by hand", help="recorded in events.jsonl"),
) -> None:
    """Point the registry at VERSION (atomic); a running `serve --registry` switches within a second."""
    from harnessrl.loop.registry import RegistryError

    reg = _registry(registry)
    try:
        with reg.lock():
            before = reg.promote(reg.resolve(version), reason=reason)
    except RegistryError as exc:
        _fail(str(exc))
    print(json.dumps({"promoted": reg.promoted(), "previous": before}))


@app.command()
def rollback(registry: Path = typer.Option(..., help="the registry folder")) -> None:
    """Back to the version promoted before the current one (the same atomic switch as promote)."""
    from harnessrl.loop.registry import RegistryError

    reg = _registry(registry)
    try:
        with reg.lock():
            before, after = reg.rollback()
    except RegistryError as exc:
        _fail(str(exc))
    print(json.dumps({"promoted": after, "previous": before}))


@app.command()
def cycle(
    config: Path = typer.Argument(..., help="loop config (YAML): registry, store, harness, benchmark, gate, train"),
    once: bool = typer.Option(False, "--once", help="run one cycle and exit"),
    every: str | None = typer.Option(None, help="run a cycle every DURATION (5h, 30m, 90s) until stopped"),
    candidate: Path | None = typer.Option(
        None, help="gate this Hugging Face folder (trained elsewhere) instead of training a candidate"
    ),
) -> None:
    """Train a candidate on the feedback-labelled traffic since the last cycle, gate it, promote or refuse it."""
    import time

    from harnessrl.loop.cycle import LoopConfig, run_cycle

    if once == (every is not None):
        _fail("give exactly one of --once or --every DURATION")
    if candidate is not None and every is not None:
        _fail("--candidate gates one folder once: give --once (every period would add the same folder again)")
    try:
        loop = LoopConfig.load(config)
    except ValueError as exc:
        _fail(str(exc))
    period = _duration(every) if every else None
    while True:
        started = time.monotonic()
        try:
            event = run_cycle(loop, candidate)
        except Exception as exc:  # under --every a failed cycle is recorded and the next one runs
            if period is None:
                if isinstance(exc, ValueError):
                    _fail(str(exc))
                raise
            console.print_exception(max_frames=4)
            _record_failed_cycle(loop, exc)
            time.sleep(max(0.0, period - (time.monotonic() - started)))
            continue
        decision = event["decision"]
        verdict = "promoted" if decision.get("promote") else ("skipped" if decision.get("skipped") else "refused")
        console.print(f"cycle: {event['version'] or 'no candidate'} {verdict} {'; '.join(decision.get('reasons', []))}")
        print(json.dumps(event, default=str))
        if period is None:
            return
        time.sleep(max(0.0, period - (time.monotonic() - started)))


def _record_failed_cycle(loop, exc: Exception) -> None:
    """A `cycle_failed` line in events.jsonl (the window stays open), or, where even that fails, the console."""
    from harnessrl.loop.registry import Registry

    try:
        registry = Registry(loop.registry)
        with registry.lock():
            registry.log("cycle_failed", error=f"{type(exc).__name__}: {exc}")
    except Exception as again:  # the registry's disk may be what failed
        console.print(Text.assemble((f"could not record the failed cycle in {loop.registry}:", "red"), f" {again}"))
    console.print(
        Text.assemble(("cycle failed", "red"), f" ({type(exc).__name__}: {exc}); the next runs in one period")
    )


def _duration(text: str) -> float:
    import re

    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd])\s*", text)
    if match is None:
        raise typer.BadParameter(f"{text!r}: a number and a unit, e.g. 5h, 30m, 90s", param_hint="--every")
    seconds = float(match[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
    if seconds <= 0:  # cycles back to back, each one's traffic a few seconds long
        raise typer.BadParameter(f"{text!r}: a period longer than 0", param_hint="--every")
    return seconds


@app.command()
def ingest(
    traces: Path = typer.Argument(
        ..., help="JSONL: one OpenAI chat conversation per line (messages, tools, outcome, feedback)"
    ),
    store: str = typer.Option("traces.db", help="trace store: SQLAlchemy URL or SQLite path"),
    quarantine: Path | None = typer.Option(
        None, help="bad lines with line number and reason; default TRACES.quarantine.jsonl"
    ),
    tasks: Path | None = typer.Option(None, help="also write the conversations as Task JSONL (to replay)"),
    sft: Path | None = typer.Option(None, help="also write demonstrations JSONL (POST /v1/demonstrations bodies)"),
) -> None:
    """Import production traces; last line: {"lines", "imported", "quarantined", "duplicates"}."""
    from harnessrl.loop import Store
    from harnessrl.loop.ingest import ingest as run_ingest

    if not traces.is_file():
        _fail(f"{traces}: no such file")
    quarantine = quarantine or traces.with_name(traces.name + ".quarantine.jsonl")
    try:
        db = Store(store)
    except (ValueError, OSError) as exc:
        _fail(f"--store: {exc}")
    try:
        counts = run_ingest(traces, db, quarantine, tasks, sft)
    finally:
        db.close()
    if counts["quarantined"]:
        console.print(Text.assemble((f"{counts['quarantined']} lines quarantined:", "yellow"), f" {quarantine}"))
    print(json.dumps(counts))


@app.command()
def tasks(
    ctx: typer.Context,
    corpus: Path = typer.Option(..., help="corpus.jsonl: {id, text, title?} per line"),
    out: Path | None = typer.Option(None, help="tasks.jsonl to write (appended as tasks pass; resumable)"),
    generator: Path | None = typer.Option(
        None,
        help="generator config (YAML/JSON, like the judge's: base_url, model, api_key_env, ...); "
        "none = the rule generator for key: value facts",
    ),
    count: int = typer.Option(100, min=1, help="tasks to keep"),
    hops: str = typer.Option("1", help="hop counts to draw from, e.g. 1,2"),
    test_share: float = typer.Option(0.2, min=0.0, max=1.0, help="share of documents whose tasks are test tasks"),
    seed: int = typer.Option(0),
    max_attempts: int | None = typer.Option(None, min=1, help="stop after this many attempts; default 20 x count"),
    audit: Path | None = typer.Option(None, help="instead: re-verify this tasks.jsonl against --corpus"),
    judge: Path | None = typer.Option(None, help="with --audit: a judge config (YAML) that scores answerability"),
) -> None:
    """Generate search tasks from a corpus (explore, write, verify quotes, distractors, split by document)."""
    import tempfile

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harnessrl.envs.search import taskgen
    from harnessrl.envs.search.data import SearchTask, load_corpus
    from harnessrl.envs.search.index import SearchIndex
    from harnessrl.types import TraceLineError, read_jsonl, read_yaml, validated

    given = _given(ctx, "out", "generator", "count", "hops", "test_share", "seed", "max_attempts")
    try:
        if judge is not None and audit is None:
            raise ValueError("--judge: scores the tasks of --audit, and there is no --audit")
        if audit is not None and given:
            raise ValueError(f"{', '.join(given)}: for generating tasks, not with --audit")
        docs = load_corpus(corpus)
        if audit is not None:
            items = read_jsonl(audit, SearchTask)
            report = taskgen.audit(items, docs)
            if judge is not None:
                import asyncio

                from harnessrl.rewards.judge import Judge, JudgeConfig

                config = validated(JudgeConfig, read_yaml(judge), judge)
                config.rubric = taskgen.ANSWERABLE
                report |= asyncio.run(taskgen.answerability(items, Judge(config)))
            print(json.dumps(report))
            return
        if not all(h.strip() in ("1", "2", "3") for h in hops.split(",")):
            raise ValueError(f"--hops {hops}: comma-separated 1, 2 or 3")
        hop_list = [int(h) for h in hops.split(",")]
        writer = (
            taskgen.LLMWriter(validated(taskgen.GeneratorConfig, read_yaml(generator), generator))
            if generator
            else taskgen.RuleWriter(docs)
        )
    except (TraceLineError, OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        _fail(str(exc))
    out = out or corpus.with_name("tasks.jsonl")
    try:  # before the index is built: a wrong --out, or a resume with other settings, fails in seconds
        started = taskgen.start(out, taskgen.run_settings(docs, writer, hop_list, seed, test_share))
    except (FileExistsError, TraceLineError, taskgen.ProgressError) as exc:  # what a resumed run's files hold
        _fail(str(exc))
    except OSError as exc:  # a folder, a folder that does not exist, no permission
        _fail(f"--out {out}: {exc.strerror or exc}")
    with tempfile.TemporaryDirectory() as folder, Progress(
        TextColumn("tasks"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[tries]} attempts"),
        TimeElapsedColumn(), console=console,
    ) as bar:  # fmt: skip
        job = bar.add_task("kept", total=count, tries=0)
        try:
            index = SearchIndex(docs, Path(folder) / "index", source=str(corpus))
        except ValueError as exc:  # nothing BM25 can index
            _fail(str(exc))
        try:
            run = taskgen.generate(
                docs, index, writer, count, hop_list, out, seed, test_share, max_attempts=max_attempts,
                progress=lambda kept, tries: bar.update(job, completed=kept, tries=tries), run=started,
            )  # fmt: skip
        except OSError as exc:  # the disk full, the folder gone
            _fail(f"--out {out}: {exc.strerror or exc}")
    print(json.dumps({"requested": count, "kept": len(run.kept), "dropped": dict(run.dropped), "hops": dict(run.hops)}))
