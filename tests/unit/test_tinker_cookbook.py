"""tinker-cookbook's own recipes, unmodified, train against `ajet tinker` (docs/tinker.md): the RL
recipe on its procedural arithmetic environment and the supervised recipe on the cookbook's bundled
example conversations. The cookbook runs from its own environment (.venv-cookbook, `make
env-cookbook`: it pins transformers 5.5) against an in-process service over the tiny model, with
only the base URL, the model name, the renderer and hyper-parameters on its command line, and no
network (HF_HUB_OFFLINE)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("tinker", reason="the Tinker SDK: pip install 'ajet[tinker]'")

from ajet.tinker_service.server import TinkerServer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv-cookbook" / "bin" / "python"
KEY = "tml-cookbook-test"
# SmolLM2's chat template is ChatML; the cookbook's qwen3_instruct renderer writes exactly it
# (test_the_renderer_matches_the_models_chat_template).
RENDERER = "qwen3_instruct"

pytestmark = pytest.mark.skipif(not PYTHON.is_file(), reason="needs tinker-cookbook's environment: make env-cookbook")


@pytest.fixture(scope="module")
def server(tinker_server: TinkerServer) -> TinkerServer:
    return tinker_server  # tests/conftest.py: over the tiny model, with this module's KEY


def cookbook(module: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TINKER_API_KEY": KEY, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "disabled", "PYTHONPATH": ""}
    proc = subprocess.run([str(PYTHON), "-m", module, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def metrics(log_path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]


def trained(server: TinkerServer, log: Path) -> bool:
    """Whether the run's final sampler weights (the service's file) moved off the base (LoRA B = 0)."""
    from safetensors.torch import load_file

    final = [json.loads(line) for line in (log / "checkpoints.jsonl").read_text().splitlines()][-1]
    run, _, name = final["sampler_path"].removeprefix("tinker://").partition("/")
    tensors = load_file(str(server.options.state_dir / "runs" / run / name / "adapter_model.safetensors"))
    return any(float(t.abs().max()) > 0 for key, t in tensors.items() if "lora_B" in key)


def test_the_renderer_matches_the_models_chat_template(tiny_model_dir: Path) -> None:
    code = (
        "import sys; from tinker_cookbook import renderers; from tinker_cookbook.tokenizer_utils import get_tokenizer\n"
        "from transformers import AutoTokenizer\n"
        "tok = get_tokenizer(sys.argv[1])\n"
        "msgs = [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'What is 4 + 5?'},\n"
        "        {'role': 'assistant', 'content': '9'}, {'role': 'user', 'content': 'And 2 + 3?'}]\n"
        f"r = renderers.get_renderer('{RENDERER}', tok)\n"
        "ours = r.build_generation_prompt(msgs).to_ints()\n"
        "theirs = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)\n"
        "print(ours == list(theirs), r.get_stop_sequences() == [tok.convert_tokens_to_ids('<|im_end|>')])\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    out = subprocess.run([str(PYTHON), "-c", code, str(tiny_model_dir)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]


def test_the_rl_recipe_trains_on_its_arithmetic_environment(server: TinkerServer, tmp_path: Path) -> None:
    assert server.service is not None
    log = tmp_path / "math_rl"
    cookbook("tinker_cookbook.recipes.math_rl.train", f"base_url={server.base_url}",
             f"model_name={server.service.settings.base_model}", f"renderer_name={RENDERER}", "lora_rank=4",
             "groups_per_batch=3", "group_size=2", "max_steps=2", "learning_rate=1e-3", f"log_path={log}",
             "behavior_if_log_dir_exists=delete")
    rows = metrics(log)
    assert [row["step"] for row in rows] == [0, 1]
    for row in rows:
        assert row["env/all/total_episodes"] == 6
        # The sampler's logprobs and the trainer's at the same weights: the service records what it
        # sampled, token for token (the cookbook's own check of the API).
        assert abs(row["optim/kl_sample_train_v1"]) < 1e-3
    # The tiny random model rarely ends a reply within 5 tokens, so its groups' rewards are often
    # all equal: zero advantages, and the adapter must not move; a mixed group must move it.
    assert trained(server, log) == any(row["env/all/by_group/frac_mixed"] > 0 for row in rows)


def test_the_supervised_recipe_trains_on_the_bundled_conversations(server: TinkerServer, tmp_path: Path) -> None:
    assert server.service is not None
    conversations = subprocess.run(
        [str(PYTHON), "-c", "import tinker_cookbook, pathlib; "
         "print(pathlib.Path(tinker_cookbook.__file__).parent / 'example_data' / 'conversations.jsonl')"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""}).stdout.strip()
    log = tmp_path / "chat_sl"
    cookbook("tinker_cookbook.recipes.chat_sl.train", f"base_url={server.base_url}",
             f"model_name={server.service.settings.base_model}", f"renderer_name={RENDERER}", "lora_rank=4",
             f"dataset={conversations}", "batch_size=4", "max_length=256", "max_steps=3", "learning_rate=1e-2",
             f"log_path={log}", "behavior_if_log_dir_exists=delete")
    rows = [row for row in metrics(log) if "train_mean_nll" in row]
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert all(0 < row["train_mean_nll"] < 20 and row["num_tokens"] > 0 for row in rows)
    assert trained(server, log)
