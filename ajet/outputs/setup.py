"""Process-wide logging for the CLI: readable lines, third-party noise turned down."""

from __future__ import annotations

import logging
import os
import sys


def configure_logging(level: str = "INFO", *, quiet: bool = False) -> None:
    """Log to stderr: rich formatting on a terminal, plain timestamped lines otherwise (CI)."""
    # Progress bars of transformers/huggingface_hub would interleave with ours.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    if sys.stderr.isatty() and not quiet:
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False, rich_tracebacks=False)
        handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2", "uvicorn.access", "urllib3", "asyncio", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a core dependency
        pass
