"""Unauthenticated load on the gateway (issue 69 §3), small: scripts/fuzz/http_flood.py's flood
(slowloris headers, idle sockets, half-sent bodies without a key) against a gateway process while
a client with a key keeps calling it. Before, slowloris connections stayed open as long as they
sent a byte a second, and half-sent bodies were buffered without a key. `make fuzz` runs the
full-size flood (2,000 idle sockets)."""

from __future__ import annotations

import pytest

from scripts.fuzz.http_flood import run_flood

pytestmark = pytest.mark.integration


def test_a_flood_fails_no_legitimate_request_and_slowloris_meets_the_header_deadline() -> None:
    result = run_flood(seconds=10, idle=300, slowloris=10, bodies=20, header_timeout_s=2.0)
    assert result.legit_requests > 20 and result.legit_failed == 0, result.failures
    opened = result.attack.slowloris_open_s
    # closed by the 2 s deadline (under the caps, nothing is evicted), not held for the 10 s
    assert len(opened) >= 10 and all(1.5 <= s <= 4.0 for s in opened), opened
    # no key: answered 401 unread (and closed), never buffered
    assert set(result.attack.body_answers) == {"401"}, result.attack.body_answers
    # every connection closed: the count is back where it was within 10 s of the attacker's exit
    # (polled: CI's loaded machine once left 4 closes unprocessed after a fixed 0.5 s wait)
    assert result.fds_after <= result.fds_before + 2, (result.fds_after_kinds, result.fds_settle_s)
