"""Small facts about network addresses and connections that several layers need (the launcher's
Ray, the sandbox service, the env-service clients): one definition each."""

from __future__ import annotations

import ipaddress

# How long an HTTP client to one of ajet's local servers keeps an idle connection for its next
# request (`httpx.Limits(keepalive_expiry=...)`). A server closes an idle connection after its
# keep-alive (uvicorn's default and ajet.http_server's: 5 s); httpx's default expiry is the same
# 5 s, so a request sent after ~5 s of quiet (the model thinking between two environment calls)
# raced the server's close and failed with a ReadError (seen once in 128 verifiers episodes, which
# reran the whole episode). Dropping idle connections well before the server does trades a new
# TCP connection on localhost (well under a millisecond) for that race.
CLIENT_KEEPALIVE_S = 1.0


def is_loopback(host: str) -> bool:
    """Whether `host` (an IP, IPv4-mapped IPv6 included, or "localhost") reaches this machine only."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool((mapped or ip).is_loopback)
