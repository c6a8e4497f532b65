"""What a hostile HTTP body costs `ajet serve`'s gateway: the server's peak RSS growth and the
time to the answer, for a chunked body sent without the client token and one sent with it
(over the body cap). A server process runs the gateway with the episode API on a stub source;
its peak RSS (VmHWM) is read before and after each request.

    python -m scripts.bench.hostile_body [--mib 2048]

Before issue 53 the episode API read a whole chunked body before its token check answered 401.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

TOKEN = "bench-token"
SERVER = f"""
import sys, time
from ajet.serve.http import attach_episode_api
from ajet.tuner.gateway import Gateway

class Source:  # never reached: every request here is refused before a route runs
    async def begin(self): raise RuntimeError
    async def finish(self, episode_id, key, request): raise RuntimeError
    async def abort(self, episode_id, key, reason): raise RuntimeError
    async def status(self): raise RuntimeError

gateway = Gateway().start()
attach_episode_api(gateway, Source(), {TOKEN!r})
print(gateway.port, flush=True)
time.sleep(3600)
"""


@dataclass
class Row:
    case: str
    status: str
    peak_rss_growth_mib: float
    seconds: float


def peak_rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def chunks(total_mib: int) -> Iterator[bytes]:
    block = b"x" * (1 << 20)
    for _ in range(total_mib):
        yield block


def measure(mib: int) -> list[Row]:
    import httpx

    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        port = int(server.stdout.readline())
        url = f"http://127.0.0.1:{port}/v1/episodes/e-1/finish"
        rows = []
        for case, headers in ((f"{mib} MiB chunked, no token", {}),
                              (f"{mib} MiB chunked, with the token (over the cap)",
                               {"Authorization": f"Bearer {TOKEN}"})):
            before = peak_rss_mib(server.pid)
            start = time.monotonic()
            try:
                status = str(httpx.post(url, content=chunks(mib), headers=headers, timeout=600).status_code)
            except httpx.HTTPError as err:  # the server answered and closed while the body was still coming
                status = f"closed ({type(err).__name__})"
            rows.append(Row(case, status, peak_rss_mib(server.pid) - before, time.monotonic() - start))
        return rows
    finally:
        server.kill()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=2048, help="body size in MiB")
    args = parser.parse_args()
    rows = measure(args.mib)
    print(f"{'case':<48} {'answer':<28} {'peak RSS growth':>16} {'seconds':>8}")
    for row in rows:
        print(f"{row.case:<48} {row.status:<28} {row.peak_rss_growth_mib:>12.1f} MiB {row.seconds:>8.2f}")


if __name__ == "__main__":
    main()
