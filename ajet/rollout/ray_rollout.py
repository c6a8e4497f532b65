"""`--with-ray` rollout: the user's workflow runs in Ray actors, everything else stays here.

The driver keeps the engine, the gateway, one tracker + session per episode, the judge and
the trainer. Only `Workflow.execute` moves: `RayWorkflow.execute(task, tuner)` (called by
the driver's unchanged TaskRunner, so retries, timeouts, judging and tracker collection
are the in-process ones) mints the episode's gateway keys from the driver's tuner and asks
an `EpisodeWorker` actor to run the workflow with a `TunerProxy`: an AgentScope
`OpenAIChatModel` on the driver's gateway that also offers the tuner's `openai_client`,
`base_url_and_key`, `register_model` and `get_model`. Every call lands in the driver's
session, so the recorded tokens are the in-process ones.

Roles: the driver mints keys for "default" and each trainable target. With no targets
(every role trainable) a role the workflow registers later reuses the default key: same
trainability, only the role label differs. A non-trainable role needs a `default_model`.

Errors: a workflow exception travels back as itself (or, if it cannot be pickled, as an
exception of the same name), infrastructure errors (unreachable gateway, 5xx) become
`InfrastructureError` (retried by the runner), a dead actor too.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import logging
import os
import pickle
import traceback
from collections.abc import Callable
from typing import Any

from pydantic import PrivateAttr

from ajet.config.schema import RayConfig, RolloutConfig
from ajet.errors import BadOutputError, InfrastructureError, WorkflowLoadError
from ajet.launcher import Launcher
from ajet.rollout.manager import RolloutManager
from ajet.rollout.runner import TaskRunner, _is_infrastructure
from ajet.rollout.sync_threads import run_in_daemon_thread
from ajet.rollout.workflow_loader import load_workflow
from ajet.sandbox.shared import ENV, TOKEN_FILE_ENV
from ajet.tuner.openai_compat import MODEL_NAME
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- actor side
def make_tuner_proxy(base_url: str, keys: dict[str, str], trainable_targets: list[str] | None,
                     timeout_s: float, role: str = "default", _shared: dict | None = None) -> Any:
    """A drop-in for ModelTuner inside an actor: AgentScope model + OpenAI-protocol helpers."""
    from agentscope.model import OpenAIChatModel  # the actor side only

    shared = _shared if _shared is not None else {"models": {}}
    trainable = set(trainable_targets or []) or None

    def key_for(name: str) -> str:
        if name in keys:
            return keys[name]
        if trainable is None:  # every role is trainable: the default key trains the same way
            return keys["default"]
        raise KeyError(
            f"role {name!r} is not in trainable_targets {sorted(trainable)}; with --with-ray a role "
            "outside them needs register_model(role, default_model=...)"
        )

    class TunerProxy(OpenAIChatModel):
        def __init__(self) -> None:
            super().__init__(MODEL_NAME, api_key=key_for(role), stream=False,
                             client_kwargs={"base_url": base_url, "max_retries": 0, "timeout": timeout_s})
            self.role = role

        @property
        def trainable(self) -> bool:
            return trainable is None or self.role in trainable

        def is_trainable_role(self, name: str) -> bool:
            return trainable is None or name in trainable

        def register_model(self, name: str, default_model: Any = None) -> Any:
            if not isinstance(name, str) or not name:
                raise ValueError(f"role must be a non-empty string, got {name!r}")
            if isinstance(default_model, str) and not self.is_trainable_role(name):
                raise ValueError(
                    f"role {name!r}: default_model={default_model!r} (a model the engine serves) is not "
                    "available with --with-ray yet: run without --with-ray, or pass an AgentScope chat model")
            if self.is_trainable_role(name) or default_model is None:
                model = make_tuner_proxy(base_url, keys, trainable_targets, timeout_s, name, shared)
            else:
                model = default_model
            shared["models"][name] = model
            return model

        def get_model(self, name: str) -> Any:
            if name not in shared["models"]:
                raise KeyError(f"role {name!r} is not registered; registered roles: "
                               f"{sorted(shared['models'])}. Call tuner.register_model({name!r}, ...) first.")
            return shared["models"][name]

        def base_url_and_key(self, name: str = "default") -> tuple[str, str]:
            return base_url, key_for(name)

        def openai_client(self, name: str = "default") -> Any:
            import openai

            return openai.AsyncOpenAI(base_url=base_url, api_key=key_for(name), max_retries=0, timeout=timeout_s)

    proxy = TunerProxy()
    shared["models"].setdefault(role, proxy)
    return proxy


class EpisodeWorker:
    """Runs `Workflow.execute` for the driver (wrapped with `ray.remote` in `start_workers`)."""

    def __init__(self, workflow_spec: Any) -> None:
        if isinstance(workflow_spec, str):
            self.workflow = load_workflow(workflow_spec)
        else:
            import cloudpickle

            self.workflow = cloudpickle.loads(workflow_spec)
        self._sync = not inspect.iscoroutinefunction(type(self.workflow).execute)

    def ready(self) -> bool:
        return True

    async def execute(self, task: dict, base_url: str, keys: dict[str, str],
                      trainable_targets: list[str] | None, timeout_s: float) -> tuple[str, Any]:
        """("output", dict) | ("other", value) | ("error", packed exception)."""
        tuner = make_tuner_proxy(base_url, keys, trainable_targets, timeout_s)
        try:
            task_obj = WorkflowTask.model_validate(task)
            if self._sync:  # a daemon thread: a hung sync execute cannot hold the actor at exit
                out = await run_in_daemon_thread(self.workflow.execute, task_obj, tuner)
            else:
                out = await self.workflow.execute(task_obj, tuner)
        except Exception as exc:  # noqa: BLE001 - sent back to the driver's runner, which classifies it
            return "error", pack_exception(exc)
        if isinstance(out, WorkflowOutput):
            return "output", out.model_dump()
        return "other", out


def pack_exception(exc: BaseException) -> dict[str, Any]:
    """An exception as data that survives the trip to the driver (pure)."""
    packed: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "infrastructure": _is_infrastructure(exc),
        "bad_output": isinstance(exc, BadOutputError),
        "pickled": None,
    }
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
        packed["pickled"] = blob
    except Exception:  # noqa: BLE001 - many exception types do not round-trip; the name still does
        pass
    return packed


def unpack_exception(packed: dict[str, Any]) -> BaseException:
    """The exception to raise in the driver for a packed one (pure)."""
    where = f"(in a Ray rollout worker)\n{packed['traceback']}"
    if packed["infrastructure"]:
        return InfrastructureError(f"{packed['type']}: {packed['message']} {where}")
    if packed["bad_output"]:
        return BadOutputError(packed["message"])
    if packed["pickled"] is not None:
        exc = pickle.loads(packed["pickled"])
        if hasattr(exc, "add_note"):
            exc.add_note(where)
        return exc
    remote_type = type(packed["type"], (RuntimeError,), {"__module__": __name__})
    return remote_type(f"{packed['message']} {where}")


# ---------------------------------------------------------------------- driver side
class RayWorkflow(Workflow):
    """Stands in for the user's workflow in the driver's TaskRunner: runs it in an actor."""

    name: str = "ray"
    _workers: list = PrivateAttr(default_factory=list)
    _load: list = PrivateAttr(default_factory=list)
    _roles: list = PrivateAttr(default_factory=list)
    _trainable_targets: Any = PrivateAttr(default=None)
    _timeout_s: float = PrivateAttr(default=300.0)

    def setup(self, workers: list, trainable_targets: list[str] | None, timeout_s: float) -> RayWorkflow:
        self._workers, self._load = list(workers), [0] * len(workers)
        self._trainable_targets = list(trainable_targets) if trainable_targets else None
        self._roles = ["default", *[r for r in (self._trainable_targets or []) if r != "default"]]
        self._timeout_s = timeout_s
        return self

    async def execute(self, task: WorkflowTask, tuner: Any) -> Any:
        import ray  # --with-ray only

        base_url = tuner.base_url_and_key("default")[0]
        keys = {role: tuner.base_url_and_key(role)[1] for role in self._roles}
        index = min(range(len(self._workers)), key=self._load.__getitem__)  # least busy actor
        self._load[index] += 1
        ref = self._workers[index].execute.remote(task.model_dump(), base_url, keys, self._trainable_targets, self._timeout_s)
        try:
            kind, value = await ref
        except asyncio.CancelledError:  # the episode timed out: stop the remote coroutine too
            ray.cancel(ref)
            raise
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
            raise InfrastructureError(f"the Ray rollout worker died: {exc}") from exc
        finally:
            self._load[index] -= 1
        if kind == "error":
            raise unpack_exception(value)
        if kind == "output":
            return WorkflowOutput.model_validate(value)
        return value  # not a WorkflowOutput: the runner reports bad_output, as in-process


def workflow_spec(workflow: Any, target: str | None) -> Any:
    """What an actor loads: the config `target` when given (workers import it themselves), else
    the workflow object pickled by value."""
    if target:
        return target
    import cloudpickle

    for obj in (type(workflow), getattr(workflow, "fn", None)):
        module = inspect.getmodule(obj) if obj is not None else None
        if module is None or module.__name__ == "__main__" or module.__name__.startswith("ajet."):
            continue
        spec = importlib.util.find_spec(module.__name__) if not module.__name__.startswith("ajet_user_") else None
        origin = getattr(spec, "origin", "") or ""
        if spec is None or "site-packages" not in origin:
            cloudpickle.register_pickle_by_value(module)  # user code, maybe not importable in workers
    return cloudpickle.dumps(workflow)


def worker_options(max_concurrency: int) -> dict[str, Any]:
    """`ray.remote` options of a rollout worker. The run's sandbox settings (`sandbox.enabled`:
    set in this process's environment by `ajet.sandbox.shared.configure`) travel in the actor's
    runtime env, so that a workflow's `shared_pool()` builds its own warm pool on the worker's
    node, also on a cluster joined with ray.address (whose workers do not inherit this
    process's environment). The service token is not among them: only the path of the file
    holding it (`TOKEN_FILE_ENV`), never the token itself in Ray's runtime env."""
    options: dict[str, Any] = {"num_cpus": 1, "max_concurrency": max(1, max_concurrency)}
    if os.environ.get(ENV):
        options["runtime_env"] = {"env_vars": {name: os.environ[name] for name in (ENV, TOKEN_FILE_ENV)
                                               if os.environ.get(name)}}
    return options


def start_workers(spec: Any, count: int, max_concurrency: int) -> list:
    import ray  # --with-ray only

    remote_cls: Any = ray.remote(**worker_options(max_concurrency))(EpisodeWorker)  # ray's actor class
    workers = [remote_cls.remote(spec) for _ in range(max(1, count))]
    try:
        ray.get([w.ready.remote() for w in workers])
    except ray.exceptions.RayActorError as exc:
        raise WorkflowLoadError(f"--with-ray: the rollout workers could not load the workflow: {exc}") from exc
    return workers


def build_ray_manager(ray_cfg: RayConfig, rollout: RolloutConfig, spec: Any, *,
                      trainable_targets: list[str] | None, judge: Any,
                      sessions: Any) -> tuple[RolloutManager, Callable[[], None]]:
    """A `RolloutManager` whose episodes run in Ray actors (the engine, the sessions and the
    tracker stay in this process); returns it with the closer that stops the workers."""
    import ray  # --with-ray only

    workers_n = max(1, ray_cfg.num_rollout_workers)
    launcher = None
    if not ray.is_initialized():
        launcher = Launcher(ray="init", ray_address=ray_cfg.address, ray_num_cpus=max(2, workers_n),
                            ray_node_ip=ray_cfg.node_ip)
        launcher.__enter__()
    try:
        per_worker = -(-rollout.max_concurrency // workers_n)
        workers = start_workers(spec, workers_n, per_worker)
    except BaseException:
        if launcher is not None:
            launcher.stop()
        raise
    proxy = RayWorkflow().setup(workers, trainable_targets, rollout.episode_timeout_s)
    manager = RolloutManager(TaskRunner(proxy, judge, sessions, rollout), rollout)
    log.info("--with-ray: %d rollout worker(s), up to %d episodes each", len(workers), per_worker)

    def close() -> None:
        for worker in workers:
            ray.kill(worker)
        if launcher is not None:
            launcher.stop()

    return manager, close
