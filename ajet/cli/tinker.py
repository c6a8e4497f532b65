"""`ajet tinker --model PATH --port 8000`: a Tinker-compatible training service on this machine
(ajet/tinker_service, docs/tinker.md). A script written for the Tinker SDK runs against it with
TINKER_BASE_URL and TINKER_API_KEY set to what it prints.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from ajet.cli.common import user_errors
from ajet.errors import SetupError

log = logging.getLogger(__name__)

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


@app.command(
    help=(
        "Serve the debug backbone's engine and trainer as a Tinker-compatible API: LoRA training "
        "clients (forward_backward, optim_step, checkpoints) and sampling on one local model. The "
        "API key is $AJET_TINKER_API_KEY (it must start with 'tml-'), or a new one printed at start."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
def tinker(
    model: Annotated[str, typer.Option("--model", help=(
        "A local Hugging Face checkpoint directory, or 'bundled' (SmolLM2-135M-Instruct).")
    )] = "bundled",
    host: Annotated[str, typer.Option("--host", help="Listen address (0.0.0.0: other machines).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port; 0 = a free one.")] = 8000,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help=(
        "Where checkpoints and tinker.json live (kept across restarts) [default: ~/.cache/ajet/tinker].")
    )] = None,
    model_name: Annotated[str, typer.Option("--model-name", help=(
        "The base_model name clients use [default: the checkpoint's absolute path, which the "
        "SDK's get_tokenizer() can load].")
    )] = "",
    lora_alpha: Annotated[int, typer.Option("--lora-alpha", help="LoRA alpha of every training client.")] = 32,
    max_samplers: Annotated[int, typer.Option("--max-samplers", help=(
        "Frozen sampler copies kept (the least recently used is dropped).")
    )] = 8,
    max_body_mb: Annotated[int, typer.Option("--max-body-mb", help="Largest request body accepted.")] = 64,
) -> None:
    with user_errors():
        try:  # the SDK's wire types: an optional extra
            import tinker as _sdk  # noqa: F401
        except ImportError as err:
            raise SetupError("ajet tinker needs the Tinker SDK: pip install 'ajet[tinker]'") from err
        from ajet.models.resolve import cache_root
        from ajet.outputs.setup import configure_logging
        from ajet.tinker_service.server import ServerOptions, TinkerServer, api_key_from_env

        configure_logging("INFO", quiet=False)
        options = ServerOptions(model=model, state_dir=state_dir or cache_root() / "tinker", host=host, port=port,
                                model_name=model_name, lora_alpha=lora_alpha, max_samplers=max_samplers,
                                max_body_mb=max_body_mb)
        key, generated = api_key_from_env()
        server = TinkerServer(options, key).setup()
        assert server.service is not None
        shown = key if generated else "($AJET_TINKER_API_KEY)"
        typer.echo(f"ajet tinker: serving {server.service.settings.base_model} on {server.base_url}\n"
                   f"  export TINKER_BASE_URL={server.base_url}\n  export TINKER_API_KEY={shown}\n"
                   f"  (also in {options.state_dir / 'tinker.json'}; checkpoints under {options.state_dir})", err=True)
        server.run()
