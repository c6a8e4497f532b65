"""ajet/http_server.py's process-level guards (issue 69 §3): the fd limit raised at start, and the
event loop's error log rate-limited (a full fd table made asyncio log one accept error ~10,000
times a second: 85 MB of log in 20 s)."""

from __future__ import annotations

import asyncio
import logging
import resource

import pytest

from ajet import http_server


def test_the_soft_fd_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 64:
        pytest.skip(f"this machine's hard fd limit ({hard}) leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    try:
        assert http_server.raise_fd_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_same_loop_error_is_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        handler = http_server._RateLimitedHandler(every_s=60.0)
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            for _ in range(10_000):
                handler(loop, {"message": "socket.accept() out of system resource", "exception": OSError(24)})
            handler(loop, {"message": "another error"})
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("socket.accept() out of system resource") and lines[1] == "another error"
