"""`ajet view`: the HTML holds one lazy JSON block per step with the right token classes."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ajet.cli.view import app
from ajet.outputs.viewer import class_runs, make_server, token_classes

runner = CliRunner()


def _record(step: int, episode: str, task: str, role: str, mask: list[int], **extra) -> dict:
    n = len(mask)
    return {
        "step": step, "episode_id": episode, "task_id": task, "group_id": task, "role": role,
        "reward": extra.pop("reward", 1.0), "is_success": extra.pop("is_success", True),
        "query": extra.pop("query", "What is 2+3?"),
        "input_ids": list(range(100, 100 + n)),
        "tokens": extra.pop("tokens", [f"w{i} " for i in range(n)]),
        "loss_mask": mask,
        "logprobs": [-0.5 if m else 0.0 for m in mask],
        "advantages": [0.75 if m else 0.0 for m in mask],
        "segments": extra.pop("segments", []),
        **extra,
    }


def make_run(root: Path) -> Path:
    """A run dir with records for steps 1 and 2: a merged two-call sample, a judge (untrained) sample."""
    run = root / "exp" / "demo"
    (run / "records").mkdir(parents=True)
    step1 = [
        _record(1, "t1-e0", "t1", "default", [0, 0, 0, 1, 1, 0, 1, 1], segments=[[3, 5], [6, 8]]),
        _record(1, "t1-e0", "t1", "judge", [0, 0, 0, 0]),
        _record(1, "t2-e0", "t2", "default", [0, 0, 1], reward=0.0, is_success=False, query="Capital of France?"),
    ]
    step2 = [
        _record(2, "t3-e1", "t3", "default", [0, 0, 1, 1], tokens=["a", "</script><b>", "\n", "zebra"],
                segments=[[2, 4]]),
    ]
    for step, recs in ((1, step1), (2, step2)):
        path = run / "records" / f"step_{step:06d}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return run


def step_blocks(page: str) -> dict[int, list[dict]]:
    found = re.findall(r'<script type="application/json" id="step-(\d+)">(.*?)</script>', page, re.S)
    return {int(step): json.loads(body) for step, body in found}


def per_token(runs: list[list]) -> list[str]:
    return [cls for start, end, cls in runs for _ in range(start, end)]


def test_token_classes_follow_loss_mask_and_role():
    assert token_classes({"loss_mask": [0, 1, 1, 0]}) == ["context", "trained", "trained", "context"]
    # A non-trainable role's sample has an all-zero mask: every token is "other role".
    assert token_classes({"loss_mask": [0, 0, 0]}) == ["other"] * 3
    assert token_classes({"loss_mask": [0, 1], "trainable": False}) == ["other", "other"]
    assert class_runs(["context", "context", "trained", "context"]) == [
        [0, 2, "context"], [2, 3, "trained"], [3, 4, "context"]]


def test_view_writes_lazy_step_blocks_with_token_classes(tmp_path: Path):
    run = make_run(tmp_path)
    result = runner.invoke(app, [str(run)])
    assert result.exit_code == 0, result.output
    out = run / "viewer" / "index.html"
    assert str(out) in result.output
    page = out.read_text(encoding="utf-8")

    blocks = step_blocks(page)
    assert sorted(blocks) == [1, 2]
    main, judge, other_ep = blocks[1]
    assert per_token(main["cls"]) == ["context"] * 3 + ["trained"] * 2 + ["context"] + ["trained"] * 2
    assert per_token(judge["cls"]) == ["other"] * 4
    assert main["segments"] == [[3, 5], [6, 8]] and main["ids"][0] == 100
    assert [a for a, n in main["adv"] for _ in range(n)] == [0.0] * 3 + [0.75] * 2 + [0.0] + [0.75] * 2
    assert other_ep["query"] == "Capital of France?"

    # The page styles the three classes and renders tokens as class="tok <class>".
    for cls in ("trained", "context", "other"):
        assert f".tok.{cls}" in page
    assert 'class="tok ${cls[i]}"' in page
    # The always-loaded index lists episodes per step, with roles and reward.
    index = json.loads(re.search(r'<script type="application/json" id="index">(.*?)</script>', page, re.S).group(1))
    step1 = index["steps"][0]
    assert step1["step"] == 1 and [e["e"] for e in step1["episodes"]] == ["t1-e0", "t2-e0"]
    assert step1["episodes"][0]["roles"] == ["default", "judge"] and step1["episodes"][0]["tr"] == 4
    assert step1["mean_reward"] == pytest.approx(0.5) and step1["success_rate"] == pytest.approx(0.5)


def test_token_text_cannot_break_out_of_its_script_block(tmp_path: Path):
    run = make_run(tmp_path)
    out = tmp_path / "custom" / "v.html"
    assert runner.invoke(app, [str(run), "--out", str(out)]).exit_code == 0
    page = out.read_text(encoding="utf-8")
    assert page.count("<script") == page.count("</script>")
    assert step_blocks(page)[2][0]["tokens"][1] == "</script><b>"


def test_view_reports_bad_run_dirs_without_traceback(tmp_path: Path):
    result = runner.invoke(app, [str(tmp_path)])
    assert result.exit_code == 2
    assert "no records/ directory" in result.output and "Traceback" not in result.output

    run = make_run(tmp_path)
    bad = _record(3, "t9-e0", "t9", "default", [0, 1, 1])
    bad["logprobs"] = [0.0]
    (run / "records" / "step_000003.jsonl").write_text(json.dumps(bad) + "\n", encoding="utf-8")
    result = runner.invoke(app, [str(run)])
    assert result.exit_code == 2
    assert "'logprobs' has 1 entries for 3 input_ids" in result.output


def test_server_serves_the_viewer(tmp_path: Path):
    run = make_run(tmp_path)
    assert runner.invoke(app, [str(run)]).exit_code == 0
    (run / "viewer" / "secret.txt").write_text("not the viewer's")
    server = make_server(run / "viewer" / "index.html", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        for path in ("/index.html", "/"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
                assert resp.status == 200
                assert b'id="step-2"' in resp.read()
        # Before (issue 53) the whole directory holding --out was served, and any Host was answered.
        for path, headers, status in (("/secret.txt", {}, 404), ("/../config.yaml", {}, 404),
                                      ("/index.html", {"Host": f"evil.example:{port}"}, 403)):
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == status
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_view_and_report_are_registered_commands():
    from ajet.cli.main import COMMANDS

    assert COMMANDS["view"][0] == "ajet.cli.view"
    assert COMMANDS["report"][0] == "ajet.cli.report"


def test_the_viewer_closes_slow_connections_and_caps_its_threads(tmp_path: Path, monkeypatch):
    """Issue 69 §3: before, each connection held a thread for as long as it stayed open."""
    import socket
    import time

    from ajet.outputs import viewer

    monkeypatch.setattr(viewer, "VIEWER_DEADLINE_S", 1.0)
    monkeypatch.setattr(viewer, "VIEWER_MAX_CONNECTIONS", 4)
    page = tmp_path / "index.html"
    page.write_text("<html>viewer</html>")
    server = make_server(page, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    socks = []
    try:
        for _ in range(6):  # 4 held, 2 closed at once
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET / HTTP/1.1\r\n")
            socks.append(sock)
        start = time.monotonic()
        closed = 0
        for sock in socks:  # a byte a 0.2 s: the deadline, not the per-read timeout, ends it
            while time.monotonic() - start < 5:
                try:
                    sock.sendall(b"X")
                    sock.settimeout(0.2)
                    if sock.recv(1) == b"":
                        closed += 1
                        break
                except TimeoutError:
                    continue
                except OSError:
                    closed += 1
                    break
        assert closed == 6 and time.monotonic() - start < 4
        for _ in range(20):  # the slots are free again once the handler threads have ended
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
                    assert resp.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        else:
            raise AssertionError("the viewer did not answer after its slow connections were closed")
    finally:
        for sock in socks:
            sock.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
