"""--backbone=tinker end to end: an ajet workflow trained through the official Tinker SDK on
`ajet tinker` started in-process on a free port over the tiny model; two steps, then a resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tinker", reason="the Tinker SDK: pip install 'ajet[tinker]'")

from ajet.backbones.registry import checked_backbone  # noqa: E402
from ajet.config import load_config  # noqa: E402
from ajet.tinker_service.server import TinkerServer  # noqa: E402
from ajet.training.adapters import adapter_parameters  # noqa: E402

KEY = "tml-backbone-test"

# Two chat calls, the second extending the first; the reward differs between episodes (the
# reply's length), so GRPO groups have a learning signal.
AGENT = '''
from ajet import Workflow, WorkflowOutput


class Talk(Workflow):
    async def execute(self, task, tuner):
        messages = [{"role": "user", "content": task.main_query}]
        first = await tuner(messages)
        text = "".join(b.get("text", "") for b in first.content if b.get("type") == "text")
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "More."}]
        second = await tuner(messages)
        more = "".join(b.get("text", "") for b in second.content if b.get("type") == "text")
        return WorkflowOutput(reward=float(len(text + more) % 7))
'''


@pytest.fixture(scope="module")
def server(tinker_server: TinkerServer) -> TinkerServer:
    return tinker_server  # tests/conftest.py: over the tiny model, with this module's KEY


def conf(tmp_path: Path, server: TinkerServer, *overrides: str) -> Any:
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "train.jsonl").write_text("".join(
        json.dumps({"task_id": f"t{i}", "question": f"Count to {i + 2}."}) + "\n" for i in range(4)))
    path = tmp_path / "run.yaml"
    path.write_text("workflow: {target: agent.py:Talk}\ntask_reader: {jsonl: {train_path: train.jsonl}}\n"
                    "rollout: {max_tokens: 4, n: 4}\nmodel: {lora: {enabled: true, r: 4}}\n")
    assert server.service is not None
    return load_config(path, [f"project.exp_dir={tmp_path / 'exp'}", "logging.quiet=true", "logging.tensorboard=false",
                              "trainer.batch_size=1", "trainer.val_every=0", "trainer.lr=0.01",
                              f"tinker.base_url={server.base_url}", f"tinker.api_key={KEY}",
                              f"tinker.base_model={server.service.settings.base_model}", *overrides])


def adapter(server: TinkerServer, model_id: str) -> dict[str, Any]:
    """A training client's adapter weights on the service."""
    assert server.service is not None
    return {k: v.detach().clone() for k, v in adapter_parameters(server.service.trainer.model, model_id).items()}


def test_two_steps_train_the_service_adapter_and_a_resume_continues(server: TinkerServer, tmp_path: Path) -> None:
    cfg = conf(tmp_path, server, "trainer.total_steps=2", "trainer.save_every=1")
    backbone = checked_backbone("tinker", cfg, "test")
    run_dir = backbone.run(cfg, with_ray=False, resume=False)
    assert run_dir is not None
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    trained = [r for r in rows if "tinker/loss_sum" in r]
    assert trained, rows  # at least one step had a learning signal and was sent
    assert all(r["policy_version"] == r["step"] for r in trained)
    # the sampler's logprobs are the trainer's at the same weights (same model, same numerics)
    assert all(r["rollout/logprob_mismatch"] < 1e-3 for r in trained)
    # the service's adapter changed: the weights the run saved for sampling differ from the first
    export = json.loads((run_dir / "final_model" / "tinker.json").read_text())
    assert export["step"] == 2 and export["sampler_weights"].startswith("tinker://")
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert ckpts == ["step_000001", "step_000002"]
    state = json.loads((run_dir / "checkpoints" / "step_000002" / ".complete").read_text())
    assert state["step"] == 2

    # resume: two more steps, on a training client made from step 2's state saved on the service
    from ajet.backbones.tinker.remote import RemoteTrainer

    resumed_from: list[str | None] = []
    original = RemoteTrainer.start

    def start(self: RemoteTrainer, **kwargs: Any) -> None:
        resumed_from.append(kwargs["resume_from"])
        original(self, **kwargs)

    cfg = conf(tmp_path, server, "trainer.total_steps=4", "trainer.save_every=1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RemoteTrainer, "start", start)
        backbone.run(cfg, with_ray=False, resume=True)
    (path,) = resumed_from
    assert path is not None and path.startswith("tinker://") and path.endswith("step_000002")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["policy_version"] == r["step"] for r in rows[2:] if "tinker/loss_sum" in r)
    assert json.loads((run_dir / "final_model" / "tinker.json").read_text())["step"] == 4


def test_weights_change_on_the_service(server: TinkerServer, tmp_path: Path) -> None:
    """One step's update moves the run's adapter on the service away from its initial weights."""
    from ajet.backbones.tinker.remote import RemoteTrainer

    seen: dict[str, dict[str, Any]] = {}
    original_train, original_close = RemoteTrainer.train, RemoteTrainer.close

    def train(self: RemoteTrainer, *args: Any, **kwargs: Any) -> Any:
        seen.setdefault("before", adapter(server, self.training.model_id))
        return original_train(self, *args, **kwargs)

    def close(self: RemoteTrainer) -> None:  # the session's end unloads its adapter: read it first
        seen["after"] = adapter(server, self.training.model_id)
        original_close(self)

    cfg = conf(tmp_path, server, "trainer.total_steps=1", "trainer.save_last_checkpoint=false")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RemoteTrainer, "train", train)
        mp.setattr(RemoteTrainer, "close", close)
        checked_backbone("tinker", cfg, "test").run(cfg, with_ray=False, resume=False)
    assert "before" in seen, "the step had no learning signal"
    before, after = seen["before"], seen["after"]
    assert any(not bool((before[k] == after[k]).all()) for k in before)


def named(server: TinkerServer, model_id: str) -> dict[str, Any]:
    """`adapter`, its keys without the training client's name (a resumed run has a new one)."""
    return {k.replace(model_id, "<client>"): v for k, v in adapter(server, model_id).items()}


def test_a_stop_after_the_service_applied_an_update_trains_that_step_again_once(server: TinkerServer,
                                                                                   tmp_path: Path) -> None:
    """Step 2's forward_backward + optim_step reach the service, then the run stops before the step
    is committed. --resume makes its training client from step 1's saved state (not the live adapter,
    which holds step 2's update), so the resumed run starts from step 1's weights, bit for bit, and
    trains step 2 once more: nothing is applied twice, no step is logged twice."""
    from ajet.backbones.tinker.remote import RemoteTrainer

    original = RemoteTrainer.train
    seen: dict[str, dict[str, Any]] = {}
    calls = {"n": 0}

    def stop_after_step_2(self: RemoteTrainer, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] < 2:
            return original(self, *args, **kwargs)
        seen["step 1"] = named(server, self.training.model_id)  # step 1's weights: what was saved
        original(self, *args, **kwargs)
        seen["step 2 applied"] = named(server, self.training.model_id)
        raise KeyboardInterrupt("stopped after the service applied step 2's update")

    cfg = conf(tmp_path, server, "trainer.total_steps=3", "trainer.save_every=1")
    backbone = checked_backbone("tinker", cfg, "test")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RemoteTrainer, "train", stop_after_step_2)
        with pytest.raises(KeyboardInterrupt):
            backbone.run(cfg, with_ray=False, resume=False)
    assert calls["n"] == 2, "steps 1 and 2 must both have had a learning signal"
    (metrics_file,) = (tmp_path / "exp").rglob("metrics.jsonl")
    run_dir = metrics_file.parent
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000001"]
    assert any(not bool((seen["step 1"][k] == seen["step 2 applied"][k]).all()) for k in seen["step 1"])

    def first_weights(self: RemoteTrainer, *args: Any, **kwargs: Any) -> Any:
        seen.setdefault("resumed", named(server, self.training.model_id))
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RemoteTrainer, "train", first_weights)
        backbone.run(cfg, with_ray=False, resume=True)
    resumed = seen["resumed"]
    assert resumed.keys() == seen["step 1"].keys()
    assert all(bool((resumed[k] == seen["step 1"][k]).all()) for k in resumed)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
