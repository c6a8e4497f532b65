"""sandbox.backend=ray (ajet/sandbox/ray_pool.py): sandboxes in Ray actors, found by name by
every process of a run, with the local sandbox's guarantees (its escapes refused and counted)."""

from __future__ import annotations

import pytest

from ajet.config.choices import SandboxBackend
from ajet.config.deploy import SandboxConfig
from ajet.errors import SandboxUnavailableError
from ajet.sandbox.box import Limits

pytestmark = pytest.mark.integration


def test_without_ray_started_the_pool_says_what_to_do() -> None:
    import ray

    if ray.is_initialized():  # another file's test on this xdist worker
        pytest.skip("Ray runs in this process already")
    from ajet.sandbox.ray_pool import RayPool

    with pytest.raises(SandboxUnavailableError, match="--with-ray"):
        RayPool(1, 1, Limits())


def test_the_run_refuses_the_ray_backend_without_with_ray() -> None:
    from ajet.config.schema import AjetConfig
    from ajet.errors import UserError
    from ajet.pipeline import run

    cfg = AjetConfig()
    cfg.sandbox = SandboxConfig(enabled=True, backend=SandboxBackend.ray)
    with pytest.raises(UserError, match="--with-ray"):
        run(cfg, runner=None, backbone="debug", with_ray=False)


@pytest.fixture(scope="module")
def ray_local():
    import ray

    from ajet.ray_env import keep_ray_local

    keep_ray_local("127.0.0.1")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_sessions_on_host_actors_run_code_and_refuse_escapes(ray_local) -> None:
    from ajet.sandbox.ray_pool import RayPool

    pool = RayPool(2, 1, Limits(wall_s=5, cpu_s=5))
    again = RayPool(2, 1, Limits(wall_s=5, cpu_s=5))  # another process of the run: the same hosts
    assert [h._actor_id for h in pool.hosts] == [h._actor_id for h in again.hosts]
    with pool.session_sync({"data.txt": "21"}) as box:
        assert box.run_python("print(2 * int(open('data.txt').read()))").stdout.strip() == "42"
        shadow = box.run_python("print(open('/etc/shadow').read())")
        assert shadow.status == "refused" and "root:" not in shadow.stdout
        assert box.run_python("while True:\n    pass").status == "timeout"
        assert box.run("echo hi > /usr/x").status == "refused"  # read-only system
        assert box.read_file("data.txt") == b"21"
        metrics = box.metrics()
    assert metrics["sandbox/calls"] == 4 and metrics["sandbox/refused"] == 2 and metrics["sandbox/timeouts"] == 1
    # released at the end of the session: the hosts hold nothing
    assert sum(ray_local.get([h.held.remote() for h in pool.hosts])) == 0


def _kill_from_the_host(host, box_id: str) -> None:  # noqa: ANN001 - the actor's handle
    """SIGKILL the sandbox's bubblewrap in the host actor's process (the host side), and wait until
    it and its server are gone: until then the server (killed by --die-with-parent) may still
    answer a call, and on a loaded machine the next call once came back "ok"."""

    def kill(self, box_id: str) -> None:  # noqa: ANN001 - the SandboxHost; defined here: sent by value
        import time

        import psutil

        proc = self._box(box_id).proc
        children = psutil.Process(proc.pid).children()
        proc.kill()
        proc.wait(timeout=30)
        def alive(child: psutil.Process) -> bool:
            try:
                return child.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return False

        deadline = time.monotonic() + 30
        while any(alive(c) for c in children):
            assert time.monotonic() < deadline, "the sandbox's server outlived bubblewrap"
            time.sleep(0.01)

    return host.__ray_call__.remote(kill, box_id)


def test_a_sandbox_that_dies_is_replaced_and_its_code_cannot_kill_it(ray_local) -> None:
    """The server is the sandbox's pid 1 (bubblewrap --as-pid-1): the code's kill is ignored and
    the session goes on with its files; a sandbox killed from the host is a crashed call, and the
    next call gets a fresh one on the host."""
    from ajet.sandbox.ray_pool import RayPool

    pool = RayPool(1, 1, Limits(wall_s=5, cpu_s=5))
    with pool.session_sync({"kept.txt": "yes"}) as box:
        assert box.run_python("import os\nos.kill(1, 9)").status in ("ok", "error")  # ignored by pid 1
        assert box.run_python("print(open('kept.txt').read())").stdout.strip() == "yes"
        ray_local.get(_kill_from_the_host(box.box.host, box.box.box_id))  # the session's RaySandbox
        assert box.run_python("print(1)").status == "crashed"
        assert box.run_python("print(1)").stdout.strip() == "1"  # a fresh sandbox on the host


def test_a_runs_hosts_live_in_its_own_namespace() -> None:
    from ajet.sandbox.ray_pool import run_namespace

    assert run_namespace("01000000") == "ajet-sandbox-01000000" != run_namespace("02000000")
    with pytest.raises(ValueError, match="job id"):
        run_namespace("")


ANOTHER_RUN = """
import json, sys
import ray
from ajet.ray_env import keep_ray_local
from ajet.sandbox.box import Limits
from ajet.sandbox.ray_pool import RayPool

keep_ray_local("127.0.0.1")
ray.init(address=sys.argv[1], log_to_driver=False)
pool = RayPool(1, 1, Limits(wall_s=5, cpu_s=5))
print(json.dumps({"namespace": pool.namespace, "host": pool.hosts[0]._actor_id.hex()}))
"""


def test_two_runs_on_one_cluster_do_not_share_hosts(ray_local) -> None:
    """The hosts' names were fixed, so a second run on the cluster got the first run's hosts
    (and their limits). A run is a Ray job: its workers share its hosts, another job has its own."""
    import json
    import subprocess
    import sys

    from ajet.sandbox.ray_pool import RayPool, host_name, run_namespace

    pool = RayPool(1, 1, Limits(wall_s=5, cpu_s=5))
    assert pool.namespace == run_namespace(ray_local.get_runtime_context().get_job_id())

    @ray_local.remote(num_cpus=0)
    class Worker:  # as a rollout worker: an actor of this run
        def namespace(self) -> str:
            return RayPool(1, 1, Limits(wall_s=5, cpu_s=5)).namespace

    assert ray_local.get(Worker.remote().namespace.remote()) == pool.namespace
    other = subprocess.run([sys.executable, "-c", ANOTHER_RUN, ray_local.get_runtime_context().gcs_address],
                           capture_output=True, text=True, timeout=300)
    assert other.returncode == 0, other.stderr[-3000:]
    theirs = json.loads(other.stdout.strip().splitlines()[-1])
    assert theirs["namespace"] != pool.namespace and theirs["host"] != pool.hosts[0]._actor_id.hex()
    mine = ray_local.get_actor(host_name(0), namespace=pool.namespace)
    assert mine._actor_id == pool.hosts[0]._actor_id
