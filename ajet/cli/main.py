"""`ajet` entry point: `ajet --conf X.yaml ...` trains; `ajet COMMAND ...` runs a subcommand.

Training is the default command so the one-line invocation stays
`ajet --conf X.yaml --backbone=debug`. Each command lives in its own module and
is imported only when chosen, so `ajet --help` stays fast.
"""

from __future__ import annotations

import importlib
import sys

from ajet.cli.allocator import AllocatorChoiceError, use_jemalloc
from ajet.signals import StoppedBeforeRun, stopping_from_the_start

# name -> (module, one-line summary shown in `ajet --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("ajet.cli.train", "Train (the default command)."),
    "episode": ("ajet.cli.episode", "Run one episode: its calls, tokens, samples, reward (the inner loop)."),
    "serve": ("ajet.cli.serve", "Train on episodes that agents run elsewhere (the episode API)."),
    "tinker": ("ajet.cli.tinker", "Serve the engine and trainer as a Tinker-compatible API (docs/tinker.md)."),
    "config": ("ajet.cli.config_cmd", "Print the default config or a resolved config."),
    "view": ("ajet.cli.view", "Write a token-level HTML viewer of a run."),
    "report": ("ajet.cli.report", "Plot a run's metrics (or compare runs) into PNGs + HTML."),
    "summary": ("ajet.cli.summary", "Print a run's summary: val success before -> after, tool use, commands."),
    "sft": ("ajet.cli.sft", "Supervised fine-tuning on agent dialogs (JSONL)."),
    "eval": ("ajet.cli.eval", "Evaluate a model on a task split: reward, pass@k, tool use."),
}


def register(name: str, module: str, summary: str) -> None:
    COMMANDS[name] = (module, summary)


def main(argv: list[str] | None = None) -> None:
    if argv is None:  # the `ajet` command itself (not a call from Python): jemalloc, by re-executing once
        try:
            use_jemalloc()
        except AllocatorChoiceError as exc:
            print(f"ajet: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    # From the first line a stop (Ctrl-C, SIGTERM, SIGHUP) says what happened and exits 130; a
    # run's own handlers take over inside it (ajet.signals, ajet.cli.common.clean_stop).
    with stopping_from_the_start():
        try:
            args = list(sys.argv[1:] if argv is None else argv)
            name = "train"
            if args and args[0] in COMMANDS:
                name = args.pop(0)
            module = importlib.import_module(COMMANDS[name][0])
            prog = "ajet" if name == "train" else f"ajet {name}"
            module.app(args=args, prog_name=prog)
        except StoppedBeforeRun as stop:
            print(f"ajet: stopped ({stop.name}) before a run began or after it ended: nothing to save.",
                  file=sys.stderr)
            raise SystemExit(130) from None


def commands_epilog() -> str:
    # "\b" keeps click from re-wrapping the table.
    lines = ["\b", "Commands (ajet COMMAND --help for details):"]
    lines += [f"  ajet {name:<8} {summary}" for name, (_, summary) in COMMANDS.items()]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    main()
