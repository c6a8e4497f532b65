"""The inner loop: how long `ajet episode` takes to show one episode, from the command's launch.

    .venv/bin/python -m scripts.bench.inner_loop [--conf tutorial/example_math_agent/math_agent.yaml]
        [--runs 3] [--checkout DIR]

Each run launches `ajet episode --conf CONF` as a new process (the model already converted:
one run is made first and not counted) and records, from the launch:
- shown: when the episode's line (`episode try-...`) reaches stdout, the moment a user sees it;
- exit: when the process has exited;
- the parts the command prints itself (`time: start-up ... imports ... model load ...`).
`--checkout DIR` runs the ajet of another checkout (its directory first on PYTHONPATH), e.g. a
`git worktree` of an earlier commit, for a before/after on the same machine. Prints the medians
and each run; a benchmark measures, it asserts nothing about speed. The machine may be shared:
the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

from scripts.bench.common import AJET, REPO, child_env, machine, print_table

PART = re.compile(r"([a-z][a-z -]*?) (\d+\.\d+) s")


def one_run(conf: str, checkout: Path | None) -> dict[str, float]:
    """Launch `ajet episode --conf conf` and time it (see the module docstring)."""
    env = child_env({"PYTHONUNBUFFERED": "1"})
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(checkout), env["PYTHONPATH"]])
    start = time.monotonic()
    proc = subprocess.Popen([*AJET, "episode", "--conf", conf], cwd=checkout or REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    times: dict[str, float] = {}
    for line in proc.stdout:
        if line.startswith("episode try-") and "shown" not in times:
            times["shown"] = time.monotonic() - start
        if line.startswith("time:"):
            times.update({name.strip(): float(s) for name, s in PART.findall(line.split("(total")[0][5:])})
    proc.wait()
    times["exit"] = time.monotonic() - start
    if proc.returncode != 0 or "shown" not in times:
        raise SystemExit(f"ajet episode --conf {conf} exited {proc.returncode} without showing an episode")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conf", default="tutorial/example_math_agent/math_agent.yaml")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--checkout", type=Path, default=None, help="another checkout's ajet (e.g. a git worktree)")
    args = parser.parse_args(argv)
    one_run(args.conf, args.checkout)  # converts the model if needed; not counted
    runs = [one_run(args.conf, args.checkout) for _ in range(args.runs)]
    keys = ["shown", "exit"] + [k for k in runs[0] if k not in ("shown", "exit")]
    rows = [[key, f"{statistics.median(r.get(key, 0.0) for r in runs):.2f}",
             " ".join(f"{r.get(key, 0.0):.2f}" for r in runs)] for key in keys]
    info = machine()
    print_table(f"ajet episode --conf {args.conf}: seconds from the launch ({args.checkout or 'this checkout'}; "
                f"{info['cpu']}, {info['cores']} cores, {' '.join(info['avx'])}; load {info['load_average']})",
                ["part", "median (s)", "each run (s)"], rows, min_width=100)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
