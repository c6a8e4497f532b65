"""Unauthenticated load on ajet's HTTP servers (issue 69 §3) while a legitimate client works.

    python -m scripts.fuzz.http_flood [--seconds 20] [--idle 2000] [--slowloris 20] [--bodies 100]

A server process runs `ajet serve`'s gateway (the episode API on a stub source, one live episode
key) with ajet's limits (`ajet.http_server`). An attacker process opens, and reopens when the
server closes them:
  - slowloris: a request line, then a header byte a second;
  - idle: sockets that connect and send nothing (its RLIMIT_NOFILE raised to fit);
  - bodies: POST /v1/chat/completions without a key, 4 MiB declared, 1 MiB sent, then silence.
Meanwhile the legitimate client calls GET /v1/models with its key, once over a kept-alive
connection and once on a new one, in turn. Printed: failed legitimate requests, their p50/p99
latency, the server's RSS and open fds before, at peak and after, and how long the slowloris
connections stayed open. `--attacker-ip 127.0.0.2` attacks from another peer address than the
client's (the per-peer cap); by default both are 127.0.0.1 (the harder case: only the
longest-waiting eviction protects the client). Measures; asserts nothing (the test does:
tests/unit/test_http_flood.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

KEY_FILE_LINE = "ready"
SERVER = """
import sys, time
from ajet.http_server import ServerLimits
from ajet.serve.http import attach_episode_api
from ajet.tuner.gateway import Gateway

class Source:  # never reached: the flood's requests are refused before a route runs
    async def begin(self): raise RuntimeError
    async def finish(self, episode_id, key, request): raise RuntimeError
    async def abort(self, episode_id, key, reason): raise RuntimeError
    async def status(self): raise RuntimeError

class Session:  # a live episode for the legitimate client's key (GET /v1/models only looks it up)
    closed = False

limits = ServerLimits(header_timeout_s=float(sys.argv[1]), max_connections=int(sys.argv[2]))
gateway = Gateway(limits=limits).start()
attach_episode_api(gateway, Source(), "flood-token")
print(gateway.port, gateway.register(Session(), "main"), flush=True)
time.sleep(3600)
"""


@dataclass
class Attack:
    """What the attacker saw (its own counts; the server's side is in `Result`)."""

    connects: int = 0
    connect_errors: int = 0
    closed_by_server: int = 0
    slowloris_open_s: list[float] = field(default_factory=list)  # open -> closed by the server
    body_answers: dict[str, int] = field(default_factory=dict)  # first status line word -> count


@dataclass
class Result:
    legit_requests: int
    legit_failed: int
    failures: list[str]
    p50_ms: float
    p99_ms: float
    rss_mib_before: float
    rss_mib_peak: float
    rss_mib_after: float
    fds_before: int
    fds_peak: int
    fds_after: int  # once settled (`settled_fds`), at most `settle_timeout_s` after the attacker exited
    fds_settle_s: float
    fds_after_kinds: dict[str, int]
    attack: Attack


def proc_status(pid: int, key: str) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled_fds(pid: int, target: int, timeout_s: float) -> tuple[int, float, dict[str, int]]:
    """The server's open fds once the flood's closes are processed: polled until at most
    `target` or `timeout_s` have passed (a fixed wait was too short on a loaded machine, where
    the server may not run for a while). Returns the count, the seconds it took and the open fds
    by kind (socket, pipe, ...), which name a leak when the count stays above `target`."""
    start = time.monotonic()
    while (count := open_fds(pid)) > target and time.monotonic() - start < timeout_s:
        time.sleep(0.05)
    kinds: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            kinds[os.readlink(f"/proc/{pid}/fd/{fd}").split(":")[0]] += 1
        except OSError:  # closed in between
            continue
    return count, round(time.monotonic() - start, 2), dict(kinds)


# ----------------------------------------------------------------------------------- attacker
async def _connect(port: int, source_ip: str, attack: Attack) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    while True:
        try:
            conn = await asyncio.open_connection("127.0.0.1", port, local_addr=(source_ip, 0))
            attack.connects += 1
            return conn
        except OSError:
            attack.connect_errors += 1
            await asyncio.sleep(0.2)


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it closed (b"" for a close without an answer)."""
    data = b""
    try:
        while chunk := await reader.read(4096):
            data += chunk
    except OSError:
        pass  # reset by the server: closed too
    return data


async def _idle(port: int, ip: str, attack: Attack, stop: float, pause: float) -> None:
    while time.monotonic() < stop:
        reader, writer = await _connect(port, ip, attack)
        try:
            await asyncio.wait_for(_until_closed(reader), stop - time.monotonic())
            attack.closed_by_server += 1
        except asyncio.TimeoutError:
            pass
        writer.close()
        await asyncio.sleep(pause)


async def _slowloris(port: int, ip: str, attack: Attack, stop: float) -> None:
    while time.monotonic() < stop:
        reader, writer = await _connect(port, ip, attack)
        opened = time.monotonic()
        closed = asyncio.ensure_future(_until_closed(reader))
        try:
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
            while not closed.done() and time.monotonic() < stop:
                writer.write(b"X")  # one byte of a header that never ends
                await asyncio.wait([closed], timeout=1.0)
        except OSError:
            pass
        if closed.done():
            attack.closed_by_server += 1
            attack.slowloris_open_s.append(round(time.monotonic() - opened, 2))
        else:
            closed.cancel()
        writer.close()


async def _half_body(port: int, ip: str, attack: Attack, stop: float, pause: float) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
           b"Content-Length: 4194304\r\n\r\n"
    while time.monotonic() < stop:
        reader, writer = await _connect(port, ip, attack)
        try:
            writer.write(head + b"x" * (1 << 20))
            answer = await asyncio.wait_for(_until_closed(reader), stop - time.monotonic())
            word = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else "closed"
            attack.body_answers[word] = attack.body_answers.get(word, 0) + 1
            attack.closed_by_server += 1
        except (asyncio.TimeoutError, OSError):
            pass
        writer.close()
        await asyncio.sleep(pause)


async def _attack(port: int, ip: str, seconds: float, idle: int, slowloris: int, bodies: int) -> Attack:
    attack, stop = Attack(), time.monotonic() + seconds
    await asyncio.gather(*[_idle(port, ip, attack, stop, 0.5) for _ in range(idle)],
                         *[_slowloris(port, ip, attack, stop) for _ in range(slowloris)],
                         *[_half_body(port, ip, attack, stop, 0.5) for _ in range(bodies)])
    return attack


def attacker_main(port: int, ip: str, seconds: float, idle: int, slowloris: int, bodies: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = idle + slowloris + bodies + 256
    if hard != resource.RLIM_INFINITY and hard < want:
        sys.exit(f"the attacker needs {want} fds; the hard RLIMIT_NOFILE is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    print(json.dumps(asdict(asyncio.run(_attack(port, ip, seconds, idle, slowloris, bodies)))), flush=True)


# --------------------------------------------------------------------------------- orchestrator
def run_flood(seconds: float = 20.0, idle: int = 2000, slowloris: int = 20, bodies: int = 100,
              attacker_ip: str = "127.0.0.1", header_timeout_s: float = 10.0, max_connections: int = 0,
              settle_timeout_s: float = 10.0) -> Result:
    """The server, the attacker and the legitimate client for `seconds`; what each saw. The
    server's fds after are counted once they are back to those before, or `settle_timeout_s`
    after the attacker exited."""
    import httpx

    server = subprocess.Popen([sys.executable, "-c", SERVER, str(header_timeout_s), str(max_connections)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    attacker = None
    try:
        assert server.stdout is not None
        port_text, key = server.stdout.readline().split()
        port, url = int(port_text), f"http://127.0.0.1:{port_text}/v1/models"
        headers = {"Authorization": f"Bearer {key}"}
        httpx.get(url, headers=headers, timeout=10).raise_for_status()
        rss_before, fds_before = proc_status(server.pid, "VmRSS"), open_fds(server.pid)
        attacker = subprocess.Popen([sys.executable, "-m", "scripts.fuzz.http_flood", "--attack", str(port),
                                     "--attacker-ip", attacker_ip, "--seconds", str(seconds), "--idle", str(idle),
                                     "--slowloris", str(slowloris), "--bodies", str(bodies)],
                                    stdout=subprocess.PIPE, text=True)
        time.sleep(min(2.0, seconds / 4))  # the flood builds up first
        latencies, failures, fds_peak, rss_peak = [], [], fds_before, rss_before
        stop = time.monotonic() + seconds - min(2.0, seconds / 4)
        with httpx.Client(headers=headers, timeout=10) as kept:
            turn = 0
            while time.monotonic() < stop:
                turn += 1
                start = time.monotonic()
                try:
                    if turn % 2:
                        status = kept.get(url).status_code
                    else:  # a new connection each time: it must get in past the flood
                        status = httpx.get(url, headers=headers, timeout=10).status_code
                    if status != 200:
                        failures.append(f"HTTP {status}")
                except httpx.HTTPError as err:
                    failures.append(f"{'kept-alive' if turn % 2 else 'new'} connection: {type(err).__name__}: {err}")
                latencies.append((time.monotonic() - start) * 1000)
                fds_peak = max(fds_peak, open_fds(server.pid))
                rss_peak = max(rss_peak, proc_status(server.pid, "VmRSS"))
                time.sleep(0.05)
        out, _ = attacker.communicate(timeout=seconds + 60)
        attack = Attack(**json.loads(out.strip().splitlines()[-1]))
        fds_after, settle_s, kinds = settled_fds(server.pid, fds_before, settle_timeout_s)
        quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
        return Result(len(latencies), len(failures), failures[:5], round(quantiles[49], 1), round(quantiles[98], 1),
                      round(rss_before, 1), round(rss_peak, 1), round(proc_status(server.pid, "VmRSS"), 1),
                      fds_before, fds_peak, fds_after, settle_s, kinds, attack)
    finally:
        for proc in (attacker, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--slowloris", type=int, default=20)
    parser.add_argument("--bodies", type=int, default=100)
    parser.add_argument("--attacker-ip", default="127.0.0.1")
    parser.add_argument("--header-timeout-s", type=float, default=10.0, help="the server's header deadline")
    parser.add_argument("--max-connections", type=int, default=0, help="the server's cap (0: its default)")
    parser.add_argument("--attack", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the attacker process
    args = parser.parse_args()
    if args.attack:
        attacker_main(args.attack, args.attacker_ip, args.seconds, args.idle, args.slowloris, args.bodies)
        return
    result = run_flood(args.seconds, args.idle, args.slowloris, args.bodies, args.attacker_ip,
                       args.header_timeout_s, args.max_connections)
    attack = result.attack
    lo = attack.slowloris_open_s
    print(f"legitimate requests: {result.legit_requests}, failed: {result.legit_failed} {result.failures}")
    print(f"latency p50 {result.p50_ms} ms, p99 {result.p99_ms} ms")
    print(f"server RSS MiB before/peak/after: {result.rss_mib_before}/{result.rss_mib_peak}/{result.rss_mib_after}; "
          f"open fds {result.fds_before}/{result.fds_peak}/{result.fds_after} "
          f"(after: {result.fds_settle_s} s after the attacker exited, {result.fds_after_kinds})")
    print(f"attacker: {attack.connects} connects ({attack.connect_errors} failed), {attack.closed_by_server} "
          f"closed by the server; slowloris closed after {min(lo, default=0)}-{max(lo, default=0)} s "
          f"({len(lo)} of them); half-sent bodies answered {attack.body_answers}")


if __name__ == "__main__":
    main()
