"""Token-level viewer of a run: one self-contained HTML file built from `RUN/records/*.jsonl`.

The page (template: `viewer_template.html`, all CSS/JS inline, no CDN) gets a small index of
episodes inline, and each step's records as its own `<script type="application/json"
id="step-N">` block that the page parses only when that step is opened, so a run of many
steps stays responsive. Which class a token gets (trained / context / other role) is decided
here, in `token_classes`, so the page and the tests agree on one rule.
"""

from __future__ import annotations

import html
import json
import logging
import re
import socket
import threading
from collections.abc import Iterable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ajet.outputs.metrics import read_jsonl
from ajet.outputs.report import RunDataError

logger = logging.getLogger(__name__)

TEMPLATE = Path(__file__).with_name("viewer_template.html")
STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")
PLACEHOLDER = re.compile(r"__AJET_(TITLE|INDEX|STEPS)__")
QUERY_CHARS = 300  # of a query kept in the always-loaded index (the full text is in the step block)


def step_files(run_dir: Path) -> dict[int, Path]:
    """RUN/records/step_*.jsonl keyed by step, in step order."""
    rec_dir = Path(run_dir) / "records"
    if not rec_dir.is_dir():
        raise RunDataError(
            f"no records/ directory in {run_dir}; pass a run directory ({{project.exp_dir}}/{{project.name}}) "
            "of a run that wrote token records"
        )
    files = {int(m.group(1)): p for p in rec_dir.glob("step_*.jsonl") if (m := STEP_FILE.search(p.name))}
    if not files:
        raise RunDataError(f"{rec_dir} holds no step_*.jsonl files yet")
    return dict(sorted(files.items()))


def token_classes(record: dict) -> list[str]:
    """'trained' (loss_mask 1), 'context' (loss_mask 0) or 'other' (a non-trainable role's sample).

    A sample of a role that is not trained has an all-zero loss mask (docs/outputs.md), or says
    so with `"trainable": false`; all its tokens are 'other'.
    """
    mask = record["loss_mask"]
    if record.get("trainable") is False or not any(mask):
        return ["other"] * len(mask)
    return ["trained" if m else "context" for m in mask]


def class_runs(classes: list[str]) -> list[list]:
    """Run-length form [[start, end, class], ...] of a per-token class list (smaller to ship)."""
    runs: list[list] = []
    for i, cls in enumerate(classes):
        if runs and runs[-1][2] == cls:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1, cls])
    return runs


def _rle(values: list[float]) -> list[list]:
    runs: list[list] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return runs


def _round(values: list, digits: int = 4) -> list:
    return [round(float(v), digits) if v is not None else None for v in values]


def page_record(record: dict, where: str) -> dict:
    """The compact form of one record the page renders; checks the per-token lists line up."""
    if "input_ids" not in record or "loss_mask" not in record:
        raise RunDataError(f"{where}: a record needs 'input_ids' and 'loss_mask' (see docs/outputs.md)")
    n = len(record["input_ids"])
    for key in ("tokens", "loss_mask", "logprobs", "advantages"):
        if key in record and len(record[key]) != n:
            raise RunDataError(
                f"{where}: episode {record.get('episode_id')!r}: '{key}' has {len(record[key])} entries "
                f"for {n} input_ids; the trainer wrote an inconsistent record"
            )
    tokens = record.get("tokens") or [f"[{t}]" for t in record["input_ids"]]
    return {
        "episode_id": str(record.get("episode_id", "?")),
        "task_id": str(record.get("task_id", "")),
        "role": str(record.get("role", "default")),
        "reward": record.get("reward"),
        "is_success": record.get("is_success"),
        "query": str(record.get("query") or ""),
        "ids": record["input_ids"],
        "tokens": tokens,
        "cls": class_runs(token_classes(record)),
        "lp": _round(record.get("logprobs") or [0.0] * n),
        "adv": _rle(_round(record.get("advantages") or [0.0] * n)),
        "segments": record.get("segments") or [],
        "break": str(record.get("break") or ""),
    }


def episode_index(records: list[dict]) -> list[dict]:
    """One summary entry per episode of a step (first-seen order): what the left list shows."""
    episodes: dict[str, dict] = {}
    for rec in records:
        entry = episodes.setdefault(
            rec["episode_id"],
            {"e": rec["episode_id"], "t": rec["task_id"], "r": rec["reward"], "s": rec["is_success"],
             "q": rec["query"][:QUERY_CHARS], "roles": [], "n": 0, "tok": 0, "tr": 0},
        )
        if rec["role"] not in entry["roles"]:
            entry["roles"].append(rec["role"])
        entry["n"] += 1
        entry["tok"] += len(rec["ids"])
        entry["tr"] += sum(end - start for start, end, cls in rec["cls"] if cls == "trained")
    return list(episodes.values())


def _step_stats(episodes: list[dict]) -> dict:
    rewards = [e["r"] for e in episodes if isinstance(e["r"], (int, float))]
    success = [bool(e["s"]) for e in episodes if e["s"] is not None]
    return {
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "success_rate": sum(success) / len(success) if success else None,
    }


def _script_json(obj: object) -> str:
    # "<" only occurs inside JSON strings; escaping it keeps "</script>" in a token harmless.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def iter_html(steps: Iterable[tuple[int, list[dict]]], title: str) -> Iterator[str]:
    """The page in pieces: template text, then one JSON block per step as it is read, then the index.

    Streaming keeps memory to one step's records however long the run; the template puts the
    index after the step blocks for that reason (the page script comes after both).
    """
    index: list[dict] = []
    fill = {"TITLE": lambda: html.escape(title), "INDEX": lambda: _script_json({"run": title, "steps": index})}
    parts = PLACEHOLDER.split(TEMPLATE.read_text(encoding="utf-8"))
    for k, part in enumerate(parts):
        if k % 2 == 0:
            yield part
        elif part != "STEPS":
            yield fill[part]()
        else:
            for step, records in steps:
                page = [page_record(r, f"records/step_{step:06d}.jsonl record {i + 1}") for i, r in enumerate(records)]
                episodes = episode_index(page)
                index.append({"step": step, "episodes": episodes} | _step_stats(episodes))
                yield f'<script type="application/json" id="step-{step}">{_script_json(page)}</script>\n'


def write_viewer(run_dir: Path, out: Path | None = None) -> Path:
    """Write the viewer of a run (default RUN/viewer/index.html); returns the file written."""
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "viewer" / "index.html"
    files = step_files(run_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    steps = ((step, read_jsonl(path)) for step, path in files.items())
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.writelines(iter_html(steps, run_dir.resolve().name))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    logger.info("viewer of %d steps written to %s", len(files), out)
    return out


def make_server(page: Path, port: int) -> ThreadingHTTPServer:
    """An HTTP server of the one viewer file `page` on 127.0.0.1 (port 0 picks a free one); the
    caller serves it. Only `/` and `/<page name>` answer, with the file read at each request:
    nothing else of the directory it lies in (with `--out ~/v.html`, the home directory) is
    served. A request whose Host is not this machine's loopback name is refused (403), so a
    web page that rebinds its own DNS name to 127.0.0.1 cannot read the viewer either.
    One thread a connection, at most `VIEWER_MAX_CONNECTIONS` (more are closed unanswered), each
    closed after `VIEWER_DEADLINE_S` whatever it is doing, and a read or write that waits
    `VIEWER_IO_TIMEOUT_S`: idle or slow connections cannot pile up threads."""
    from http.server import BaseHTTPRequestHandler

    page = Path(page)
    server: _BoundedHTTPServer

    class ViewerHandler(BaseHTTPRequestHandler):
        timeout = VIEWER_IO_TIMEOUT_S  # each read or write of the socket

        def setup(self) -> None:
            super().setup()
            # a client sending its request a byte at a time beats the per-read timeout: the
            # connection's whole life is bounded too (one request, HTTP/1.0)
            self._deadline = threading.Timer(VIEWER_DEADLINE_S, _shut, (self.connection,))
            self._deadline.daemon = True
            self._deadline.start()

        def finish(self) -> None:
            self._deadline.cancel()
            super().finish()

        def do_GET(self) -> None:  # noqa: N802 (stdlib name)
            port_now = server.server_address[1]
            allowed = {f"{name}:{port_now}" for name in ("127.0.0.1", "localhost", "[::1]")}
            if self.headers.get("Host", "") not in allowed:
                self._reply(403, b"forbidden: open the viewer at http://127.0.0.1:%d/\n" % port_now, "text/plain")
            elif self.path.split("?")[0] not in ("/", f"/{page.name}"):
                self._reply(404, b"not found: this server serves the viewer only\n", "text/plain")
            else:
                self._reply(200, page.read_bytes(), "text/html; charset=utf-8")

        def _reply(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib name)
            logger.debug("%s - %s", self.address_string(), format % args)

    server = _BoundedHTTPServer(("127.0.0.1", port), ViewerHandler)
    return server


VIEWER_MAX_CONNECTIONS = 32
VIEWER_DEADLINE_S = 30.0
VIEWER_IO_TIMEOUT_S = 10.0


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # the handler's blocked read or write ends at once
    except OSError:
        pass  # already closed: the connection ended before its deadline


class _BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most `VIEWER_MAX_CONNECTIONS` connection threads."""

    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(VIEWER_MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            logger.debug("viewer: %d connections open; %s closed unanswered", VIEWER_MAX_CONNECTIONS, client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
