"""A Ray that ajet starts listens on 127.0.0.1 only (ray.node_ip), both the in-process one
(--with-ray) and the head the GPU backbones start: Ray runs any code sent to its ports, and on
Linux it binds them on every interface unless told otherwise (ajet.ray_env.ray_env)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ajet.launcher import Launcher
from ajet.net import is_loopback
from ajet.ray_env import listening_addresses, ray_env


def host_of(address: str) -> str:
    return address.rsplit(":", 1)[0]


@pytest.mark.parametrize("host,expected", [
    ("127.0.0.1", True), ("localhost", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("127.3.0.1", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("node-3", False),
])
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


def test_a_named_node_ip_is_passed_to_ray_and_not_switched_to_loopback() -> None:
    assert ray_env("127.0.0.1") == {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    assert ray_env("10.0.0.5") == {}


@pytest.mark.integration
def test_ray_head_listens_on_loopback_only(tmp_path) -> None:
    with Launcher(ray="head", ray_num_cpus=1, log_dir=tmp_path) as launcher:
        head = launcher.children[0].proc
        deadline = time.monotonic() + 90  # the launcher returns once the GCS answers
        while time.monotonic() < deadline:
            addresses = listening_addresses(head.pid)
            if any(a.endswith(":10001") for a in addresses):  # Ray Client, started last
                time.sleep(2)
                addresses = listening_addresses(head.pid)
                break
            time.sleep(0.5)
        assert launcher.ray_address.startswith("127.0.0.1:")
    # the GCS, the raylet, Ray Client (10001), the workers: several sockets, all on loopback
    assert len(addresses) >= 3, addresses
    exposed = [a for a in addresses if not is_loopback(host_of(a))]
    assert exposed == [], f"Ray listens beyond loopback: {exposed} (all: {addresses})"


JOIN = ("import ray\nray.init()  # RAY_ADDRESS from the environment\n"
        "print(ray.get(ray.remote(lambda: 6 * 7).remote()))")


@pytest.mark.integration
def test_a_child_joins_the_loopback_head(tmp_path) -> None:
    """What the trinity trainer does: a separate process joins the head through
    `ray_child_env()` (address, loopback switch, token auth) and runs a task."""
    with Launcher(ray="head", ray_num_cpus=1, log_dir=tmp_path) as launcher:
        env = {**os.environ, **launcher.ray_child_env()}
        out = subprocess.run([sys.executable, "-c", JOIN], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "42"


LOCAL_RAY = """
import json, os, sys
import ray  # imported before the launcher: the switch must still take effect
from ajet.launcher import Launcher
from ajet.ray_env import listening_addresses

@ray.remote
def ping():
    return 1

with Launcher(ray="init", ray_num_cpus=1):
    assert ray.get(ping.remote()) == 1
    print(json.dumps(listening_addresses(os.getpid())))
"""


@pytest.mark.integration
def test_local_ray_listens_on_loopback_only() -> None:
    out = subprocess.run([sys.executable, "-c", LOCAL_RAY], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    addresses = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(addresses) >= 3, addresses
    exposed = [a for a in addresses if not is_loopback(host_of(a))]
    assert exposed == [], f"Ray listens beyond loopback: {exposed} (all: {addresses})"
