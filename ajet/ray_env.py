"""Ray's addresses: a Ray that ajet starts listens on loopback only unless told otherwise (Ray
runs any code sent to its ports), and which addresses a process listens on (the tests'
check of it)."""

from __future__ import annotations

import os
import sys

from ajet.net import is_loopback

# Ray (2.60, Linux) resolves a loopback --node-ip-address to the machine's own address and binds
# its GCS, raylet and worker ports on every interface; only this switch (meant for laptops, read
# when `ray._private.ray_constants` is imported, and inherited by Ray's child processes) makes it
# use 127.0.0.1 for all of them. Measured with `ss -ltnp`: docs/backbones.md, "--with-ray".
_RAY_LOCAL_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ray_env(node_ip: str) -> dict[str, str]:
    """Environment for a Ray process that ajet starts (a head, or a trainer that calls
    `ray.init` itself): loopback-only unless `node_ip` names another interface."""
    return {_RAY_LOCAL_SWITCH: "0"} if is_loopback(node_ip) else {}


def keep_ray_local(node_ip: str) -> None:
    """Make a `ray.init` in this process listen on loopback only (see `ray_env`); works also
    when Ray was imported already (the switch is then a module constant it has read)."""
    if not is_loopback(node_ip):
        return
    os.environ[_RAY_LOCAL_SWITCH] = "0"
    if "ray._private.ray_constants" in sys.modules:  # Ray imported already: this import is free
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False


def listening_addresses(pid: int) -> list[str]:
    """`host:port` of every TCP socket that process `pid` and its descendants listen on."""
    # Ray's dependency; only tests and diagnostics ask. It ships no types (nor is types-psutil installed).
    import psutil  # type: ignore[import-untyped]

    found = []
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [f"{c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def restore_env(key: str, old: str) -> None:
    """Put environment variable `key` back to `old` ("": unset)."""
    if old:
        os.environ[key] = old
    else:
        os.environ.pop(key, None)
