"""Small facts about network addresses that several layers need (the launcher's Ray, the
sandbox service): one definition each."""

from __future__ import annotations

import ipaddress


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
