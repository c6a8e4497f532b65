"""scripts/bench/hostile_body.py against the real gateway (issue 53): a 256 MiB chunked body
without the client token is answered 401 and costs the server under 10 MiB of peak RSS (before:
the body was read whole first, +513 MiB); with the token it is cut off at the cap with a 413."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def bench(script: Any) -> Any:
    return script("bench.hostile_body")


def test_a_hostile_body_is_refused_before_the_server_reads_it(bench: Any) -> None:
    no_token, over_cap = bench.measure(256)
    assert no_token.status in ("401", "closed (WriteError)", "closed (RemoteProtocolError)"), no_token
    assert over_cap.status in ("413", "closed (WriteError)", "closed (RemoteProtocolError)"), over_cap
    assert no_token.peak_rss_growth_mib < 10 and over_cap.peak_rss_growth_mib < 10, (no_token, over_cap)
