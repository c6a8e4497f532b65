"""`ajet episode` (issue 58 §1) on every tutorial's workflow, on the tiny model: one episode of the
first train task runs in-process and is shown as training would see it (calls, tokens,
samples). The CLI itself, its errors and --pdb: tests/integration/test_episode_command.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ajet.cli.episode import print_shown
from ajet.config import load_config
from ajet.config.schema import EvalSplit
from ajet.eval.episode import show_episodes

HERE = Path(__file__).parent

# One config per workflow class of the tutorials (the others reuse one of these workflows).
EXAMPLES = [
    "example_appworld/appworld.yaml",
    "example_coding_agents/mini_swe_agent.yaml",
    "example_countdown/countdown.yaml",
    "example_frozenlake/frozenlake.yaml",
    "example_frozenlake/frozenlake_compaction.yaml",
    "example_function_workflow/adder.yaml",
    "example_gym_frozenlake/gym_frozenlake.yaml",
    "example_learn2ask/learn2ask.yaml",
    "example_math_agent/math_agent.yaml",
    "example_reasoning_gym/chain_sum.yaml",
    "example_math_agent/code_agent.yaml",
    "example_math_agent/math_agent_openai.yaml",
    "example_math_agent/math_agent_http.yaml",
    "example_remote_agent/remote_agent.yaml",
    "example_werewolves/werewolves.yaml",
]
# What a config needs beyond the tiny model: the remote agent's own in-process workflow (its
# YAML has none: its agents run elsewhere), appworld's env server (started here).
EXTRA = {"example_remote_agent/remote_agent.yaml":
         [f"workflow.target={HERE}/example_remote_agent/in_process.py:RemoteAgentInProcess"],
         # a function workflow's YAML has none either: ajet.tune passes the function
         "example_function_workflow/adder.yaml": [f"workflow.target={HERE}/example_function_workflow/adder.py:adder"]}


@pytest.fixture
def env_server_url() -> Iterator[str]:
    from ajet.task_reader.env_server import create_app, serve_in_thread

    with serve_in_thread(create_app(num_train=4, num_val=2)) as url:
        yield url


@pytest.mark.tutorial
@pytest.mark.integration
@pytest.mark.parametrize("example", EXAMPLES)
def test_one_episode_of_each_example(example: str, tiny_model_dir: Path, request: pytest.FixtureRequest,
                                     capsys: pytest.CaptureFixture) -> None:
    overrides = [f"model.path={tiny_model_dir}", "rollout.max_tokens=8", *EXTRA.get(example, [])]
    if example.startswith("example_appworld"):
        overrides.append(f"task_reader.env_service.base_url={request.getfixturevalue('env_server_url')}")
    cfg = load_config(HERE / example, overrides)
    shown = show_episodes(cfg, task="0", n=1, split=EvalSplit.train)
    (view,) = shown.views
    ep = view.episode
    assert ep.ok, f"{example}: {ep.reason}: {ep.error_message[-2000:]}"
    assert view.calls and all(c.completion_ids for c in view.calls)
    # every trained completion token is in exactly one sample
    trained = sum(len(c.completion_ids) - sum(c.completion_forced or []) for c in view.calls if c.trainable)
    assert sum(sum(s.loss_mask) for s in view.samples) == trained
    # a call forced by the tool-call grammar is context (the remote agent's one call, cut at 8 tokens)
    forced_only = all(c.completion_forced and all(c.completion_forced) for c in view.calls)
    assert trained > 0 or forced_only
    assert set(shown.timings) >= {"model load", "engine start", "episodes"}
    print_shown(shown, tokens=True)
    out = capsys.readouterr().out
    assert f"task {shown.task.task_id} (train #0)" in out and "call 1 [" in out and "samples: " in out
