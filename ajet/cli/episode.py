"""`ajet episode --conf X.yaml [--task 0] [--split train] [--n 1] [--tokens] [--pdb] [KEY=VALUE ...]`:
one episode of the workflow, shown as training would see it (`ajet.eval.episode`)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated

import typer

from ajet.cli.common import Conf, Overrides, env_servers_running, user_errors
from ajet.cli.convert_model import converting_in_background
from ajet.errors import ConfigError, WorkflowLoadError
from ajet.outputs.setup import configure_logging

if TYPE_CHECKING:  # pragma: no cover
    from ajet.config.schema import AjetConfig, EvalSplit
    from ajet.eval.episode import Shown


def _process_age() -> float:
    """Seconds since this process started (Linux: /proc), else 0: the interpreter's own
    start-up and the CLI's imports belong to the time a user waits."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
            return max(0.0, float(uptime.read().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return 0.0


START = time.monotonic() - _process_age()  # the process's start

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)

# How much of a message or reply a line shows (--full: all of it).
CLIP = 160


@app.command(
    help=(
        "Run one episode (or --n K) of the workflow on one task and show what training would see: "
        "each call's messages, reply, tool calls and finish reason; its tokens and which are trained; "
        "the merged samples; the reward; and the seconds each part took. Nothing is trained or written. "
        "Runs in this process: a breakpoint() in the workflow stops there, and --pdb opens the debugger "
        "at the workflow's exception."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
def episode(
    conf: Conf,
    overrides: Overrides = None,
    task: Annotated[str, typer.Option("--task", "-t", help="The task: its index in the split, or its id.")] = "0",
    split: Annotated[str, typer.Option("--split", help="train, val or test.")] = "train",
    n: Annotated[int, typer.Option("--n", min=1, help="Episodes of that task.")] = 1,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Checkpoint dir [default: model.path].")] = None,
    tokens: Annotated[bool, typer.Option("--tokens", help=(
        "Print each call's completion token by token: trained tokens plain, untrained ones [in brackets]."))] = False,
    full: Annotated[bool, typer.Option("--full", help="Print whole messages, not their first 160 characters.")] = False,
    pdb: Annotated[bool, typer.Option("--pdb", help=(
        "Open the debugger at the workflow's exception (its frames alive); no episode timeout."))] = False,
    engine_dtype: Annotated[str, typer.Option("--engine-dtype", help=(
        "The engine's weights for this look: auto (the fastest here: float16 on most x86 CPUs, "
        "4-8x float32's decode), float32, float16, bfloat16, bfloat16_linear, or 'config' for the "
        "config's rollout.engine_dtype. Nothing is trained, so the run's own precision is not needed "
        "(its tokens may differ in the last digits)."))] = "auto",
    watch: Annotated[bool, typer.Option("--watch", "-w", help=(
        "After the episode, wait for a change to the workflow's Python files (the ones beside it), "
        "import them again and run the episode again: the model and the engine stay loaded, so a "
        "change shows in the seconds of one episode. Ctrl-C ends it."))] = False,
) -> None:
    with user_errors():
        # OmegaConf (~0.15 s): not for `ajet episode --help`, the lightest command
        from ajet.config import load_config
        from ajet.config.schema import EvalSplit

        timings: dict[str, float] = {}
        if split not in {s.value for s in EvalSplit}:
            raise ConfigError(f"--split {split}: use train, val or test")
        extra = [*(overrides or []), *([f"model.path={model}"] if model else []),
                 *([f"rollout.engine_dtype={engine_dtype}"] if engine_dtype != "config" else [])]
        cfg = load_config(conf, extra)
        configure_logging(cfg.logging.level, quiet=True)
        timings["start-up"] = time.monotonic() - START
        # The bundled model's first conversion runs beside what follows (ajet.cli.convert_model).
        with converting_in_background(cfg.model, cfg.logging.level):
            imported = time.monotonic()
            # pydantic, httpx, the rollout, the task readers (~0.5 s; torch and the agent framework later, as each
            # part needs them): timed as "imports", and not for --help
            from ajet.eval.episode import for_debugger, show_episodes

            timings["imports"] = time.monotonic() - imported

            if pdb:
                cfg = for_debugger(cfg)
            hook = _post_mortem if pdb else None
            with env_servers_running(cfg):  # a verifiers or OpenEnv environment's server, as training starts it
                if watch:
                    _watch(cfg, task=task, n=n, split=EvalSplit(split), hook=hook, timings=timings, tokens=tokens,
                           full=full)
                    return
                shown = show_episodes(cfg, task=task, n=n, split=EvalSplit(split), on_workflow_error=hook,
                                      timings=timings)
    print_shown(shown, tokens=tokens, full=full)
    _exit(0 if all(view.episode.ok for view in shown.views) else 1)


def _watch(cfg: AjetConfig, *, task: str, n: int, split: EvalSplit, hook: Callable[[BaseException], None] | None,
           timings: dict[str, float], tokens: bool, full: bool) -> None:
    """`--watch`: show the episode, then again after each change to the workflow's files."""
    # imported already by `episode` (see there): not for --help
    from ajet.eval.episode import Tryout, file_stamps, wait_for_change, watched_files

    files = watched_files(cfg)
    since, stamps = START, file_stamps(files)  # a save from here on counts, during the episode too
    with Tryout.open(cfg, split=split, check_task=task, timings=timings) as tryout:
        while True:
            shown = tryout.show(task, n, on_workflow_error=hook, timings=timings)
            print_shown(shown, tokens=tokens, full=full, since=since)
            typer.echo(f"\nwatching {len(files)} file(s) beside {cfg.workflow.target.rpartition(':')[0]} "
                       "(Ctrl-C to stop)")
            while True:
                changed, stamps = wait_for_change(files, stamps)
                typer.echo(f"\n{changed.name} changed: importing the workflow again")
                since, timings = time.monotonic(), {}
                try:
                    tryout.reload()
                    timings["workflow import"] = time.monotonic() - since
                    break
                except WorkflowLoadError as exc:  # the last good workflow stays until the next change
                    typer.echo(f"error: {exc}", err=True)


def _exit(code: int) -> None:
    """Leave at once: everything is printed and closed (the engine, the gateway, the sandboxes),
    and the interpreter's teardown of torch, transformers and the agent framework's modules
    would add ~2 s (AVX2-only machine) to a command meant to take seconds."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _post_mortem(exc: BaseException) -> None:
    import pdb
    import traceback

    traceback.print_exception(type(exc), exc, exc.__traceback__)
    typer.echo("ajet episode --pdb: the debugger at the workflow's exception (c continues, q quits)", err=True)
    pdb.post_mortem(exc.__traceback__)


def _clip(text: object, full: bool) -> str:
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)
    text = text.replace("\n", "\\n")
    return text if full or len(text) <= CLIP else text[:CLIP] + f"... ({len(text)} chars)"


def _content(message: Mapping[str, object]) -> object:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return content or ""


def _tool_calls(message: Mapping[str, object]) -> list[tuple[object, object]]:
    """(name, arguments) of each tool call of `message`. A workflow's messages are shown as they
    are: a part that is not in the OpenAI shape shows as None (a name) or "" (arguments)."""
    calls = message.get("tool_calls")
    found: list[tuple[object, object]] = []
    for call in calls if isinstance(calls, list) else []:
        fn = call.get("function") if isinstance(call, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        found.append((fn.get("name"), fn.get("arguments", "")))
    return found


def print_shown(shown: Shown, *, tokens: bool = False, full: bool = False, since: float = START) -> None:
    """Print `shown` (`ajet.eval.episode.Shown`); the total is the seconds since `since`."""
    echo = typer.echo
    echo(f"task {shown.task.task_id} ({shown.split} #{shown.index}): {_clip(shown.task.main_query, full)}")
    for view in shown.views:
        ep = view.episode
        echo("")
        verdict = f"reward {ep.reward:.3f}" + (" (success)" if ep.is_success else "") if ep.ok else ep.reason
        echo(f"episode {ep.episode_id}: {ep.status}, {verdict}, {len(view.calls)} calls, {ep.duration_s:.2f} s")
        seen = 0  # messages printed so far: each call shows the ones it adds
        for call in view.calls:
            new = call.messages[seen:] if call.fork_cause in ("", "first_call") else call.messages
            seen = len(call.messages) + 1  # + its reply, sent back in the next call's messages
            trained = sum(1 for i, f in enumerate(call.completion_forced or [False] * len(call.completion_ids))
                          if not f) if call.trainable else 0
            fork = f", new timeline: {call.fork_cause}" if call.fork_cause not in ("", "first_call") else ""
            echo(f"  call {call.call_index + 1} [{call.role}] finish {call.finish_reason}: prompt "
                 f"{len(call.prompt_ids)} tokens, completion {len(call.completion_ids)} tokens, "
                 f"{trained} trained{fork}")
            for message in new:
                echo(f"    {message.get('role', '?'):>9} | {_clip(_content(message), full)}")
                for name, arguments in _tool_calls(message):
                    echo(f"    {'':>9} | tool call {name}({_clip(arguments, full)})")
            reply = call.response_message or {}
            echo(f"    {'reply':>9} > {_clip(_content(reply), full)}")
            for name, arguments in _tool_calls(reply):
                echo(f"    {'':>9} > tool call {name}({_clip(arguments, full)})")
            if tokens:
                forced = call.completion_forced or [False] * len(call.completion_ids)
                pieces = [view.decode([t]) for t in call.completion_ids]
                marked = [p if call.trainable and not f else f"[{p}]" for p, f in zip(pieces, forced, strict=True)]
                line = "|".join(m.replace("\n", "\\n") for m in marked)
                echo(f"    {'tokens':>9} | {line}")
        if not ep.ok:
            echo(f"  {ep.reason}: {ep.error_message.strip()}")
            continue
        trained_total = sum(sum(s.loss_mask) for s in view.samples)
        echo(f"  samples: {len(view.samples)} from {len(view.calls)} calls, "
             f"{sum(len(s.input_ids) for s in view.samples)} tokens, {trained_total} trained")
        for k, sample in enumerate(view.samples, 1):
            brk = sample.metadata.get("break", "")
            calls = sorted({c + 1 for c in sample.token_call_ids if c >= 0})
            echo(f"    sample {k} [{sample.role}]: {len(sample.input_ids)} tokens, {sum(sample.loss_mask)} "
                 f"trained, calls {calls}" + (f", starts after a {brk}" if brk else ""))
        output = ep.output
        if output is not None and output.metadata:
            echo(f"  output metadata: {_clip(output.metadata, full)}")
        if output is not None and output.log_metrics:
            echo(f"  log_metrics: {_clip(output.log_metrics, full)}")
        truth = shown.task.metadata.get("answer")
        if truth is not None and output is not None:
            from ajet.judge.base import answer_text  # loaded with ajet.eval.episode; not for --help

            echo(f"  answer {_clip(answer_text(output), full)!r}, expected {_clip(truth, full)!r}")
    parts = "  ".join(f"{name} {seconds:.2f} s" for name, seconds in shown.timings.items())
    echo(f"\ntime: {parts}  (total {time.monotonic() - since:.1f} s; engine {shown.engine_dtype}, --engine-dtype)")
