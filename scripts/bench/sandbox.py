"""What the sandbox for model-written code (ajet.sandbox) costs, cold and warm.

A cold start, a call on a warm sandbox (Python code, a shell command, a fresh interpreter for
comparison), an episode on a warm pool, and the calls per second K threads sustain on a pool of K.

    .venv/bin/python -m scripts.bench.sandbox [--quick] [--seconds 5] [--pause 0.1]

Rows (p50/p95 in ms, with the number of samples):
- cold start: `Sandbox(limits).start()` until the server inside says ready;
- warm call: `run_python("print(1)")` on a started sandbox (a fork of the warm server);
- warm shell call: `run("echo 1")` (fork + exec of /bin/sh);
- fresh interpreter: `run([box.python, "-c", "print(1)"])`, what a call would cost without the
  warm server;
- episode: acquire from a warm pool of 2 + one call + release, one after another with `--pause`
  between them so the pool can refill (its cold starts counted);
- throughput K=1,2,4: K threads, each running sessions of 5 calls of `sum(range(10**5))` on a
  pool of K for `--seconds`: calls/s, episodes/s and the pool's cold starts (an acquire that
  found no warm sandbox); its samples are calls.

`--quick`: fewer samples and 1 s of throughput per K (~10 s in all), for smoke runs. Needs
bubblewrap (`make sandbox`). A benchmark measures; it asserts nothing about speed. The machine
may be shared: repeat runs and compare like with like.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ajet.sandbox.box import Limits, RunResult, Sandbox
from ajet.sandbox.pool import SandboxPool
from scripts.bench.common import cpu_flags, cpu_model, print_table

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")
TASK = "print(sum(range(10**5)))"
CALLS_PER_EPISODE = 5
LIMITS = Limits()


@dataclass
class Row:
    case: str
    samples: int
    times_s: list[float] = field(default_factory=list)
    not_ok: int = 0
    calls_per_s: float | None = None
    episodes_per_s: float | None = None
    cold_starts: int | None = None


def machine() -> str:
    """The CPU model, the core count and which of FLAGS the CPU has."""
    flags = cpu_flags()
    marks = ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in FLAGS)
    return f"cpu: {cpu_model() or '?'}, {os.cpu_count()} cores; {marks}"


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), interpolated between the nearest samples."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    at = (len(ordered) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def timed(case: str, n: int, call: Callable[[], RunResult | None]) -> Row:
    """`call` n times (after one untimed warm-up); a RunResult that is not ok is counted."""
    call()
    row = Row(case, n)
    for _ in range(n):
        start = time.perf_counter()
        result = call()
        row.times_s.append(time.perf_counter() - start)
        if result is not None and not result.ok:
            row.not_ok += 1
    return row


def cold_start(n: int) -> Row:
    row = Row("cold start: Sandbox(...).start()", n)
    for _ in range(n):
        start = time.perf_counter()
        box = Sandbox(LIMITS).start()
        row.times_s.append(time.perf_counter() - start)
        box.close()
    return row


def warm_calls(n_calls: int, n_fresh: int) -> list[Row]:
    box = Sandbox(LIMITS).start()
    try:
        return [
            timed('warm call: run_python("print(1)")', n_calls, lambda: box.run_python("print(1)")),
            timed('warm shell call: run("echo 1")', n_calls, lambda: box.run("echo 1")),
            timed("fresh interpreter: run([python, -c, ...])", n_fresh,
                  lambda: box.run([box.python, "-c", "print(1)"])),
        ]
    finally:
        box.close()


def wait_warm(pool: SandboxPool, timeout_s: float = 30.0) -> None:
    """Until the pool has started its first `size` sandboxes."""
    deadline = time.monotonic() + timeout_s
    while pool.started < pool.size and time.monotonic() < deadline:
        time.sleep(0.01)


def episodes(n: int, pause_s: float) -> Row:
    pool = SandboxPool(size=2, limits=LIMITS)
    try:
        wait_warm(pool)
        row = Row("episode: pool of 2, acquire + 1 call + release", n)
        for _ in range(n):
            time.sleep(pause_s)
            start = time.perf_counter()
            with pool.session_sync() as session:
                result = session.run_python("print(1)")
            row.times_s.append(time.perf_counter() - start)
            row.not_ok += not result.ok
        row.cold_starts = pool.cold_starts
        return row
    finally:
        pool.close()


def throughput(threads: int, seconds: float) -> Row:
    pool = SandboxPool(size=threads, limits=LIMITS)
    try:
        wait_warm(pool)
        cold_before = pool.cold_starts
        lock = threading.Lock()
        counts = {"calls": 0, "episodes": 0, "not_ok": 0}
        deadline = time.perf_counter() + seconds

        def worker() -> None:
            while time.perf_counter() < deadline:
                not_ok = 0
                with pool.session_sync() as session:
                    for _ in range(CALLS_PER_EPISODE):
                        not_ok += not session.run_python(TASK).ok
                with lock:
                    counts["calls"] += CALLS_PER_EPISODE
                    counts["episodes"] += 1
                    counts["not_ok"] += not_ok

        start = time.perf_counter()
        workers = [threading.Thread(target=worker) for _ in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        elapsed = time.perf_counter() - start
        return Row(f"throughput: {threads} thread(s), pool of {threads}, {CALLS_PER_EPISODE} calls/episode",
                   counts["calls"], not_ok=counts["not_ok"], calls_per_s=counts["calls"] / elapsed,
                   episodes_per_s=counts["episodes"] / elapsed, cold_starts=pool.cold_starts - cold_before)
    finally:
        pool.close()


def show(rows: list[Row]) -> None:
    from rich.markup import escape

    def ms(row: Row, q: float) -> str:
        return f"{1000 * percentile(row.times_s, q):.2f}" if row.times_s else "-"

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    print_table("ajet sandbox: latency (ms) and throughput",
                ["case", "samples", "p50 ms", "p95 ms", "calls/s", "episodes/s", "cold starts", "not ok"],
                [[escape(row.case), str(row.samples), ms(row, 50), ms(row, 95), rate(row.calls_per_s),
                  rate(row.episodes_per_s), "-" if row.cold_starts is None else str(row.cold_starts), str(row.not_ok)]
                 for row in rows], min_width=160, right=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, 1 s per throughput row (~10 s)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="seconds per throughput row (default 5, 1 with --quick)")
    parser.add_argument("--pause", type=float, default=0.1, help="seconds between episodes, for the pool to refill")
    args = parser.parse_args()
    n_cold, n_calls, n_fresh, n_episodes = (3, 50, 20, 15) if args.quick else (10, 200, 100, 50)
    seconds = args.seconds if args.seconds is not None else (1.0 if args.quick else 5.0)

    probe = Sandbox(LIMITS)
    print(machine())
    print(f"sandbox: python {probe.python}, cgroups {probe.cgroup_kind or 'none'}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    started = time.perf_counter()
    rows = [cold_start(n_cold), *warm_calls(n_calls, n_fresh), episodes(n_episodes, args.pause)]
    rows += [throughput(k, seconds) for k in (1, 2, 4)]
    show(rows)
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
