"""The Trinity backbone against the real trinity-rft package (runs in `.venv-trinity`:
`make test-trinity`; `make test` runs it; skipped in an environment without trinity).

What runs for real here, on a CPU: Trinity's config loader and validators on the config our
driver writes; Trinity's task formatter resolving our workflow plugin from the taskset; a
Trinity `ModelWrapper` handing the plugin its OpenAI client; the plugin running one ajet
episode (workflow, tracker, merge) and returning Trinity `Experience`s; Trinity's own
serialisation and padding of those experiences. What stands in: the vLLM server behind the
endpoint (`vllm_stub.VllmStub`, ajet's LocalEngine on a tiny model) and the Ray actor behind
the ModelWrapper (it reports a policy version and the server address).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("trinity", reason="runs in .venv-trinity: make test-trinity (part of make test)")

from vllm_stub import FakeModelWrapper, VllmStub  # noqa: E402


@pytest.fixture()
def prepared(tmp_path: Path, two_calls_conf: Path) -> tuple[Path, Path]:
    """(trinity_config.yaml, run dir) as `ajet --backbone=trinity` writes them."""
    from ajet.backbones.trinity.driver import prepare
    from ajet.config import load_config

    cfg = load_config(two_calls_conf, [f"project.exp_dir={tmp_path / 'exp'}"])
    path = prepare(cfg, resume=False)
    return path, path.parent


def test_trinity_loads_and_validates_our_config(prepared: tuple[Path, Path]) -> None:
    from trinity.common.config import load_config

    path, run = prepared
    config = load_config(str(path)).check_and_update()  # Trinity's schema, then all its validators
    assert config.algorithm.repeat_times == 2
    assert config.algorithm.algorithm_type == "multi_step_grpo"
    assert config.checkpoint_job_dir == str(run / "trinity")
    [taskset] = config.buffer.explorer_input.tasksets  # the validators move `taskset` here
    assert taskset.path == str(run / "tasks") and taskset.rollout_args.max_tokens == 6
    assert config.explorer.rollout_model.enable_openai_api is True


def test_plugin_runs_an_episode_into_trinity_experiences(prepared: tuple[Path, Path]) -> None:
    from trinity.buffer.schema.formatter import TaskFormatter
    from trinity.common.config import load_config
    from trinity.common.experience import Experience, gather_action_masks, gather_token_ids

    from ajet.backbones.gpu_worker import EpisodeRuntime
    from ajet.backbones.trinity.workflow import AjetTrinityWorkflow
    from ajet.engine.local import LocalEngine
    from ajet.models.load import load_model_and_tokenizer

    path, run = prepared
    config = load_config(str(path)).check_and_update()
    [taskset] = config.buffer.explorer_input.tasksets
    rows = [json.loads(line) for line in (Path(taskset.path) / "train.jsonl").read_text().splitlines()]
    task = TaskFormatter(taskset).format(rows[1])
    assert task.workflow is AjetTrinityWorkflow  # resolved from default_workflow_type's dotted path
    task.batch_id = 0

    from ajet.config import load_config as load_ajet_config

    model, tokenizer = load_model_and_tokenizer(load_ajet_config(run / "config.yaml").model)
    engine = LocalEngine(model, tokenizer, max_batch_size=2, max_model_len=2048)
    stub = VllmStub(engine, tokenizer).start()
    try:
        rollout_model = config.explorer.rollout_model
        wrapper = FakeModelWrapper(stub.address, rollout_model.model_path, api_key=rollout_model.api_key,
                                   version=3)
        workflow = task.to_workflow(model=wrapper)
        experiences = asyncio.run(workflow.run_async())
    finally:
        for runtime in EpisodeRuntime._instances.values():
            runtime.close()
        EpisodeRuntime._instances.clear()
        stub.stop()
        engine.close()

    assert len(stub.requests) == 2  # the workflow's two calls, token ids in
    assert all(isinstance(r["prompt"], list) and r["max_tokens"] == 6 for r in stub.requests)
    assert len(experiences) == 1 and isinstance(experiences[0], Experience)  # the two calls merged
    exp = experiences[0]
    assert exp.experience_type == "multi_turn" and exp.reward == 0.25 and exp.eid.step == 0
    assert exp.info["group_id"] == "t1" and exp.metrics["ajet/workflow/turns"] == 2.0
    tokens = exp.tokens.tolist()
    second_prompt = stub.requests[1]["prompt"]
    assert tokens[: len(second_prompt)] == second_prompt  # the second call extends the first
    assert tokens[: exp.prompt_length] == stub.requests[0]["prompt"]
    mask = exp.action_mask.tolist()
    assert len(mask) == len(tokens) - exp.prompt_length == len(exp.logprobs)
    first_len = len(second_prompt) - exp.prompt_length  # first completion + the "More." turn
    assert mask[0] and not all(mask[:first_len]) and mask[first_len]  # user turn untrained
    assert all(lp == 0.0 for lp, m in zip(exp.logprobs.tolist(), mask, strict=True) if not m)
    assert all(lp < 0.0 for lp, m in zip(exp.logprobs.tolist(), mask, strict=True) if m)

    # Trinity ships experiences between actors serialised, then pads them for its trainer.
    [back] = Experience.deserialize_many(Experience.serialize_many(experiences))
    assert back.tokens.tolist() == tokens and back.action_mask.tolist() == mask
    padded_mask = gather_action_masks([back], max_response_length=len(mask) + 3)
    assert padded_mask.tolist() == [mask + [False] * 3]
    padded = gather_token_ids([back], max_prompt_length=exp.prompt_length + 2,
                              max_response_length=len(mask) + 3, pad_token_id=0)
    assert padded.tolist() == [[0, 0] + tokens + [0, 0, 0]]


def test_model_wrapper_has_what_the_plugin_uses() -> None:
    """FakeModelWrapper's members, checked in trinity's source (importing it needs vllm)."""
    import ast
    import importlib.util

    root = Path(importlib.util.find_spec("trinity").origin).parent
    tree = ast.parse((root / "common" / "models" / "model.py").read_text())
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelWrapper"]
    members = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}

    def is_property(name: str) -> bool:
        return any(isinstance(d, ast.Name) and d.id == "property" for d in members[name].decorator_list)

    assert isinstance(members["get_openai_async_client"], ast.FunctionDef)
    assert not is_property("get_openai_async_client")
    assert is_property("api_key") and is_property("model_path")
    assert is_property("model_version_async") and isinstance(members["model_version_async"], ast.AsyncFunctionDef)
    source = ast.unparse(members["get_openai_async_client"])
    assert "'model_path'" in source and "/v1" in source  # client.model_path, base_url {address}/v1
