"""A fork server for tests that start many short `ajet` runs: it imports ajet's CLI, torch and
transformers once, then runs each command in a forked child, so a run costs its own work, not
the ~4 s of imports. Run as a script (a fresh process whose torch has started no threads, so
forking it is safe); one JSON request per stdin line, one JSON reply per stdout line:

    {"argv": [...], "env": {...}, "cwd": "...", "log": "...", "out": "...", "timeout_s": 300}
    -> {"rc": <exit code, or -N when signal N killed it; -999 past timeout_s>}

A child runs `ajet.cli.main.main(argv)` with `env` added to its environment, its stderr in
`log` and its stdout in `out` (in `log` too when there is no `out`). The exit code is what
`ajet` would have exited with. `tests/integration/cli.py` is its client for tests that run the
CLI like a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def child(request: dict) -> None:
    os.chdir(request["cwd"])
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the server's stdin carries its requests
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin, now /dev/null
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    if request.get("out"):  # stdout in its own file
        fd = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    code = 1
    try:
        from ajet.cli.main import main

        main(request["argv"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported as the exit code, traceback in the log
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    import openai  # noqa: F401 - the workflows' client (~540 modules)

    # transformers imports a model's modules on first use: ~2.7 s per run for the tiny Llama
    import transformers.models.llama.modeling_llama  # noqa: F401
    import uvicorn  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import ajet.cli.main  # noqa: F401 - what every child needs, imported once
    import ajet.cli.serve  # noqa: F401
    import ajet.cli.train  # noqa: F401
    import ajet.rl.recipe  # noqa: F401 - torch, transformers and the recipe
    import ajet.tuner.gateway  # noqa: F401

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(request)
        deadline = time.monotonic() + float(request.get("timeout_s", 300))
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = -1
                break
            time.sleep(0.02)
        rc = -999 if status == -1 else os.waitstatus_to_exitcode(status)
        print(json.dumps({"rc": rc, "pid": pid}), flush=True)


if __name__ == "__main__":
    serve()
