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

    from ajet.launcher import keep_ray_local

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


def test_a_sandbox_killed_by_its_code_is_replaced(ray_local) -> None:
    from ajet.sandbox.ray_pool import RayPool

    pool = RayPool(1, 1, Limits(wall_s=5, cpu_s=5))
    with pool.session_sync() as box:
        assert box.run_python("import os\nos.kill(os.getppid(), 9)").status == "crashed"  # kills the server
        assert box.run_python("print(1)").stdout.strip() == "1"  # a fresh sandbox on the host
