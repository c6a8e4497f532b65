"""--with-ray on the debug backbone: episodes run in Ray actors against the driver's gateway,
training results are the in-process kind (merged multi-call samples, workflow errors by
name, weights change). Plus fast checks of the proxy tuner and the error round trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ajet.errors import BadOutputError, InfrastructureError
from ajet.rollout.ray_rollout import make_tuner_proxy, pack_exception, unpack_exception

WORKFLOW = '''
import ray
from ajet import Workflow, WorkflowOutput


class TwoTurns(Workflow):
    """Two calls that extend each other (one merged sample); task t3 always raises."""

    async def execute(self, task, tuner):
        in_actor = ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
        if task.task_id == "t3":
            raise ValueError("task t3 always fails")
        client = tuner.openai_client()
        messages = [{"role": "user", "content": task.main_query}]
        first = await client.chat.completions.create(model="policy", messages=messages)
        messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                     {"role": "user", "content": "Say it again."}]
        second = await tuner(messages)  # the tuner itself, as an AgentScope model
        text = "".join(block.get("text", "") for block in second.content if block.get("type") == "text")
        reward = sum(ch in "aeiou" for ch in text) / max(1, len(text))
        from ajet.sandbox import shared_pool  # the run's sandbox, in the actor's own pool

        pool = shared_pool()
        async with pool.session() as box:
            ran = (await box.arun_python("print(6 * 7)")).stdout.strip() == "42"
        return WorkflowOutput(reward=reward, log_metrics={"in_ray_actor": float(in_actor), "sandbox_ran": float(ran),
                                                          "sandbox_hosts": float(len(getattr(pool, "hosts", [])))})
'''


def make_run(tmp_path: Path, model_dir: Path) -> Path:
    (tmp_path / "agent.py").write_text(WORKFLOW)
    lines = [json.dumps({"task_id": f"t{i}", "question": f"Tell me about {i}."}) for i in range(8)]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    conf = tmp_path / "run.yaml"
    conf.write_text(f"""
project: {{name: ray, exp_dir: {tmp_path / 'exp'}}}
model: {{path: {model_dir}}}
workflow: {{target: agent.py:TwoTurns}}
task_reader: {{jsonl: {{train_path: train.jsonl}}}}
rollout: {{n: 2, max_tokens: 6, temperature: 1.0, max_retries: 0}}
trainer: {{total_steps: 2, batch_size: 4, lr: 0.01}}
ray: {{num_rollout_workers: 2}}
sandbox: {{enabled: true, pool_size: 1}}
logging: {{tensorboard: false}}
""")
    return conf


@pytest.mark.integration
def test_two_steps_with_ray_train_like_in_process(tmp_path: Path, tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    conf = make_run(tmp_path, tiny_model_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true", "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run([sys.executable, "-m", "ajet.cli.main", "--conf", str(conf), "--with-ray"],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    run = tmp_path / "exp" / "ray"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    # every successful episode ran inside a Ray actor, not in the driver
    assert all(r["workflow/in_ray_actor"] == 1.0 for r in train)
    # ... and ran model code in the run's sandbox there (sandbox.enabled reaches the actors)
    assert all(r["workflow/sandbox_ran"] == 1.0 and r["workflow/sandbox_hosts"] == 0.0 for r in train)  # bwrap here
    # the 8 tasks are all seen in 2 steps of 4: t3's two episodes fail, by the workflow's own error type
    assert sum(r.get("rollout/failed/workflow_error:ValueError", 0.0) for r in train) == 2.0
    assert sum(r["rollout/ok"] for r in train) == 14.0
    # the driver's tracker recorded both calls of an episode and merged them into one sample
    records = [json.loads(line) for step in (1, 2)
               for line in (run / "records" / f"step_{step:06d}.jsonl").read_text().splitlines()]
    assert records and all(r["task_id"] != "t3" for r in records)
    assert any(len(r["segments"]) == 2 for r in records)
    assert all(sum(r["loss_mask"]) > 0 for r in records)
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(run / "final_model").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight changed"


@pytest.mark.integration
def test_with_ray_the_next_step_rolls_out_during_the_update_and_sandboxes_are_actors(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    """rollout.max_staleness with Ray workers: the prefetched rollout runs in the actors while the
    driver updates the weights. With sandbox.backend=ray the workers' code runs in the run's
    sandbox host actors (ajet/sandbox/ray_pool.py), which both workers find by name."""
    conf = make_run(tmp_path, tiny_model_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true", "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run([sys.executable, "-m", "ajet.cli.main", "--conf", str(conf), "--with-ray",
                             "rollout.max_staleness=1", "rollout.engine_dtype=float16", "algorithm.tis_cap=2",
                             "sandbox.backend=ray", "sandbox.ray_hosts=2"],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "exp" / "ray" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["rollout/prefetched"] for r in train] == [0.0, 1.0]
    assert all(r["workflow/in_ray_actor"] == 1.0 and r["rollout/staleness_max"] <= 1 for r in train)
    assert all(r["workflow/sandbox_ran"] == 1.0 and r["workflow/sandbox_hosts"] == 2.0 for r in train)


# ---------------------------------------------------------------------- fast pieces
def test_workers_carry_the_runs_sandbox_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from ajet.rollout.ray_rollout import worker_options
    from ajet.sandbox.shared import ENV

    monkeypatch.setenv(ENV, "")
    assert "runtime_env" not in worker_options(4)
    monkeypatch.setenv(ENV, '{"enabled": true, "pool_size": 3}')
    assert worker_options(4)["runtime_env"] == {"env_vars": {ENV: '{"enabled": true, "pool_size": 3}'}}


def test_proxy_routes_roles_to_the_driver_keys() -> None:
    keys = {"default": "k-default", "solver": "k-solver"}
    everyone = make_tuner_proxy("http://gw/v1", keys, None, 30.0)
    assert everyone.base_url_and_key() == ("http://gw/v1", "k-default")
    assert everyone.trainable and everyone.is_trainable_role("anything")
    # no trainable targets = every role trained: an undeclared role shares the default key
    helper = everyone.register_model("helper")
    assert helper.role == "helper" and helper.base_url_and_key("helper")[1] == "k-default"
    assert everyone.get_model("helper") is helper
    client = everyone.openai_client("solver")
    assert client.api_key == "k-solver" and str(client.base_url).startswith("http://gw/v1")

    targeted = make_tuner_proxy("http://gw/v1", keys, ["solver"], 30.0)
    assert not targeted.trainable and targeted.register_model("solver").trainable
    judge_model = object()
    assert targeted.register_model("critic", default_model=judge_model) is judge_model
    with pytest.raises(KeyError, match="default_model"):
        targeted.register_model("critic2")
    with pytest.raises(KeyError, match="not registered"):
        targeted.get_model("nobody")


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


class Unpicklable(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickle calls cls(*args) with one arg: fails
        super().__init__(f"{a}/{b}")


def test_exceptions_round_trip_with_their_kind() -> None:
    back = unpack_exception(pack_exception(raised(ValueError("bad value"))))
    assert type(back) is ValueError and "bad value" in str(back)
    assert "Ray rollout worker" in "".join(getattr(back, "__notes__", []))
    odd = unpack_exception(pack_exception(raised(Unpicklable(1, 2))))
    assert type(odd).__name__ == "Unpicklable" and "1/2" in str(odd)
    assert isinstance(unpack_exception(pack_exception(raised(ConnectionError("gateway down")))), InfrastructureError)
    assert isinstance(unpack_exception(pack_exception(raised(BadOutputError("returned str")))), BadOutputError)
