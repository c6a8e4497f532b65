"""Several models served by one local engine (issue 26): per-role LoRA adapters in one mixed
batch, the frozen initial weights, a checkpoint directory; the prefix cache kept per adapter."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tiny_models import tiny_llama

from ajet.engine.base import INITIAL_MODEL, EngineFeatures, SamplingParams

ROLES = ["wolf", "seer", "witch"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


class Tokenizer:
    """What the engine needs of a tokenizer for a 64-token vocabulary."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


def lora_model(roles=ROLES, seed=1):
    """The tiny Llama with one LoRA adapter per role, each perturbed differently (peft inits
    lora_B to zero: every adapter would equal the base)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, task_type="CAUSAL_LM")
    model = get_peft_model(tiny_llama(), config, adapter_name=roles[0])
    for role in roles[1:]:
        model.add_adapter(role, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    return model.eval()


def reference_logprobs(model, prompt, completion, adapter=None):
    """One forward of prompt + completion with `adapter` active (None: the base, no adapter)."""
    with torch.inference_mode():
        ids = torch.tensor([prompt + completion])
        if adapter is None:
            with model.disable_adapter():
                logits = model(input_ids=ids).logits[0]
        else:
            previous = model.active_adapter
            model.set_adapter(adapter)
            try:
                logits = model(input_ids=ids).logits[0]
            finally:
                model.set_adapter(previous)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def together(engine, calls):
    """Greedy completions of (prompt, model) calls admitted in one batch."""
    from test_engine_prefix_cache import together as admitted_together

    params = SamplingParams(temperature=0.0, max_tokens=6)
    return [r[0] for r in admitted_together(engine, [(p, params, m) for p, m in calls])]


PROMPTS = [[5, 9, 13, 2, 40, 7], [3, 3, 8], [11, 12, 13, 14, 15, 16, 17, 18, 19], [60, 1, 2, 30]]


@pytest.mark.parametrize("cache_tokens", [0, 512])
def test_mixed_adapter_batch_equals_one_forward_per_adapter(cache_tokens):
    from ajet.engine.local import LocalEngine

    model = lora_model()
    calls = [(p, m) for p in PROMPTS for m in (*ROLES, INITIAL_MODEL, None)]
    with LocalEngine(model, Tokenizer(), eos_token_ids=[], max_batch_size=64,
                     prefix_cache_tokens=cache_tokens) as engine:
        assert engine.adapters == tuple(ROLES)
        completions = together(engine, calls)
        assert engine.stats["max_batch"] == len(calls)  # one decode batch held every adapter
    outputs = {}
    for (prompt, name), completion in zip(calls, completions, strict=True):
        adapter = {INITIAL_MODEL: None, None: ROLES[0]}.get(name, name)
        expected = reference_logprobs(model, prompt, completion.token_ids, adapter)
        assert max(abs(a - b) for a, b in zip(completion.logprobs, expected, strict=True)) < 1e-4
        outputs[tuple(prompt), name] = completion.logprobs
    # The adapters differ, so the test compares different things (None is the first role's).
    for prompt in PROMPTS:
        firsts = {round(outputs[tuple(prompt), m][0], 4) for m in (*ROLES, INITIAL_MODEL)}
        assert len(firsts) == len(ROLES) + 1
        same = zip(outputs[tuple(prompt), None], outputs[tuple(prompt), ROLES[0]], strict=True)
        assert max(abs(a - b) for a, b in same) < 1e-4


def test_prefix_cache_keeps_each_adapters_kv_apart():
    from ajet.engine.local import LocalEngine

    model = lora_model()
    prompt = list(range(1, 40))
    params = SamplingParams(temperature=0.0, max_tokens=4)
    with LocalEngine(model, Tokenizer(), eos_token_ids=[], prefix_cache_tokens=4096) as engine:
        (wolf,) = asyncio.run(engine.generate(prompt, params, model="wolf"))
        # The same prompt again for another adapter: the wolf's KV is cached but must not serve it.
        (seer,) = asyncio.run(engine.generate(prompt, params, model="seer"))
        assert engine.take_metrics()["engine/cache_hit_rate"] == 0.0
        (seer_again,) = asyncio.run(engine.generate(prompt + seer.token_ids[:1], params, model="seer"))
        assert engine.take_metrics()["engine/cache_hit_rate"] > 0.9  # its own KV serves it
    assert wolf.logprobs != seer.logprobs
    for completion, adapter in ((wolf, "wolf"), (seer, "seer")):
        expected = reference_logprobs(model, prompt, completion.token_ids, adapter)
        assert max(abs(a - b) for a, b in zip(completion.logprobs, expected, strict=True)) < 1e-4
    expected = reference_logprobs(model, prompt + seer.token_ids[:1], seer_again.token_ids, "seer")
    assert max(abs(a - b) for a, b in zip(seer_again.logprobs, expected, strict=True)) < 1e-4


def _train_a_little(engine, model):
    """What an update does to the policy: weights change inside a pause, the version bumps."""
    with engine.paused(), torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad or "lora_" in name:
                param.add_(torch.randn_like(param) * 0.3)
        engine.bump_version()


@pytest.mark.parametrize("lora", [True, False])
def test_initial_model_does_not_drift(lora, caplog):
    from ajet.engine.local import LocalEngine

    model = lora_model() if lora else tiny_llama()
    prompt = PROMPTS[2]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    with caplog.at_level("INFO", logger="ajet.engine.served_models"), \
            LocalEngine(model, Tokenizer(), eos_token_ids=[], prefix_cache_tokens=1024) as engine:
        (initial,) = asyncio.run(engine.generate(prompt, params, model=INITIAL_MODEL))
        (policy,) = asyncio.run(engine.generate(prompt, params))
        _train_a_little(engine, model)
        engine.take_metrics()
        (initial_after,) = asyncio.run(engine.generate(prompt, params, model=INITIAL_MODEL))
        # The frozen model's KV survived the update: its prompt came from the prefix cache.
        assert engine.take_metrics()["engine/cache_hit_rate"] > 0.5
        (policy_after,) = asyncio.run(engine.generate(prompt, params))
        assert engine.take_metrics()["engine/cache_hit_rate"] == 0.0  # the policy's KV did not
    assert policy_after.policy_version == 1
    assert max(abs(a - b) for a, b in zip(policy.logprobs, policy_after.logprobs, strict=True)) > 1e-3
    assert initial_after.token_ids == initial.token_ids
    assert max(abs(a - b) for a, b in zip(initial.logprobs, initial_after.logprobs, strict=True)) < 1e-5
    # Full fine-tuning copies the weights, and says what it costs; LoRA serves the base.
    copied = [r.getMessage() for r in caplog.records if "'initial'" in r.getMessage()]
    assert bool(copied) == (not lora)
    if not lora:
        assert "GB of weights" in copied[0]


def test_an_evaluation_engine_serves_initial_with_the_policy_itself(caplog):
    """`fixed_weights` (ajet eval): the weights never change, so "initial" is the policy: the
    same tokens and logprobs, no frozen copy made, and nothing may update the weights."""
    from ajet.engine.local import LocalEngine

    prompt = PROMPTS[1]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    with caplog.at_level("INFO", logger="ajet.engine.served_models"), \
            LocalEngine(tiny_llama(), Tokenizer(), eos_token_ids=[], fixed_weights=True) as engine:
        (policy,) = asyncio.run(engine.generate(prompt, params))
        (initial,) = asyncio.run(engine.generate(prompt, params, model=INITIAL_MODEL))
        with pytest.raises(RuntimeError, match="fixed_weights"):
            engine.bump_version()
    assert initial.token_ids == policy.token_ids
    assert max(abs(a - b) for a, b in zip(initial.logprobs, policy.logprobs, strict=True)) < 1e-5
    assert not [r for r in caplog.records if "'initial'" in r.getMessage()]  # no copy


def test_a_checkpoint_directory_is_served_frozen(tmp_path):
    from ajet.engine.local import LocalEngine

    other = tiny_llama()
    with torch.no_grad():
        for param in other.parameters():
            param.mul_(1.7)
    other.save_pretrained(tmp_path / "opponent")
    model = lora_model()
    prompt = PROMPTS[0]
    with LocalEngine(model, Tokenizer(), eos_token_ids=[], prefix_cache_tokens=1024) as engine:
        engine.check_model(str(tmp_path / "opponent"))
        (got, mine) = together(engine, [(prompt, str(tmp_path / "opponent")), (prompt, "seer")])
        _train_a_little(engine, model)
        (again,) = asyncio.run(engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=6),
                                               model=str(tmp_path / "opponent")))
    with torch.inference_mode():
        logits = other(torch.tensor([prompt + got.token_ids])).logits[0]
    expected = torch.log_softmax(logits, -1)
    ref = [float(expected[len(prompt) - 1 + i, t]) for i, t in enumerate(got.token_ids)]
    assert max(abs(a - b) for a, b in zip(got.logprobs, ref, strict=True)) < 1e-4
    assert again.token_ids == got.token_ids and got.logprobs != mine.logprobs


@pytest.mark.parametrize("fixed", [True, False])
def test_initial_names_the_pipelines_first_model_when_given(tmp_path, fixed):
    """`initial_model` (a pipeline stage after training: model.initial_path): "initial" is that
    checkpoint, served frozen, not this engine's own weights (here: different ones), in an
    evaluation's engine too."""
    from ajet.engine.local import LocalEngine

    first = tiny_llama()
    first.save_pretrained(tmp_path / "first")
    warmed = tiny_llama()
    with torch.no_grad():
        for param in warmed.parameters():
            param.mul_(1.5)
    prompt = PROMPTS[2]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    with LocalEngine(warmed, Tokenizer(), eos_token_ids=[], fixed_weights=fixed,
                     initial_model=str(tmp_path / "first")) as engine:
        engine.check_model(INITIAL_MODEL)
        (initial,) = asyncio.run(engine.generate(prompt, params, model=INITIAL_MODEL))
        (policy,) = asyncio.run(engine.generate(prompt, params))
    with torch.inference_mode():
        logits = first(torch.tensor([prompt + initial.token_ids])).logits[0]
    expected = torch.log_softmax(logits, -1)
    ref = [float(expected[len(prompt) - 1 + i, t]) for i, t in enumerate(initial.token_ids)]
    assert max(abs(a - b) for a, b in zip(initial.logprobs, ref, strict=True)) < 1e-4
    assert initial.logprobs != policy.logprobs


def test_unknown_or_incompatible_models_are_refused_with_the_fix(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from ajet.engine.local import LocalEngine

    LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2)).save_pretrained(tmp_path / "other_vocab")
    (tmp_path / "empty").mkdir()
    with LocalEngine(lora_model(), Tokenizer(), eos_token_ids=[]) as engine:
        with pytest.raises(ValueError, match="not served by this engine.*'wolf', 'seer', 'witch'"):
            engine.check_model("hunter")
        with pytest.raises(ValueError, match="vocab_size: 100 vs the model's 64"):
            engine.check_model(str(tmp_path / "other_vocab"))
        with pytest.raises(ValueError, match="neither config.json"):
            engine.check_model(str(tmp_path / "empty"))
        with pytest.raises(ValueError, match="not served"):
            asyncio.run(engine.generate([1, 2], SamplingParams(max_tokens=2), model="hunter"))


def test_a_peft_adapter_directory_is_merged_into_the_base_or_refused(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ajet.engine.local import LocalEngine

    def adapter_of(base, out):
        peft = get_peft_model(base, LoraConfig(r=2, target_modules=TARGETS, init_lora_weights=False))
        peft.save_pretrained(out)
        return peft.eval()

    mine = adapter_of(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / "mine")
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4)).save_pretrained(tmp_path / "other_base")
    adapter_of(AutoModelForCausalLM.from_pretrained(tmp_path / "other_base"), tmp_path / "theirs")
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompt = [1, 2, 3, 4, 5]
    with LocalEngine(policy, AutoTokenizer.from_pretrained(tiny_model_dir), eos_token_ids=[]) as engine:
        with pytest.raises(ValueError, match="trained on .*other_base, whose shapes differ.*hidden_size: 32"):
            engine.check_model(str(tmp_path / "theirs"))
        (got,) = asyncio.run(engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=4),
                                             model=str(tmp_path / "mine")))
    expected = reference_logprobs(mine, prompt, got.token_ids, "default")
    assert max(abs(a - b) for a, b in zip(got.logprobs, expected, strict=True)) < 1e-4


# ---------------------------------------------------------------------- the trainable model
def test_load_trainable_model_gives_each_role_an_adapter(tiny_model_dir):
    from ajet.config.schema import LoraConfig, ModelConfig
    from ajet.errors import ConfigError
    from ajet.training.model import load_trainable_model

    cfg = ModelConfig(path=str(tiny_model_dir), device="cpu", lora=LoraConfig(enabled=True, r=2, per_role=True))
    model, _ = load_trainable_model(cfg, seed=0, trainable_targets=["wolf", "seer"])
    assert list(model.peft_config) == ["wolf", "seer"] and model.active_adapter == "wolf"
    lora = {name: p for name, p in model.named_parameters() if "lora_" in name}
    assert lora and all(p.requires_grad for p in lora.values())  # every role's adapter is trained
    assert {n.split(".")[-2] for n in lora} == {"wolf", "seer"}
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    assert all(float(p.detach().abs().max()) == 0 for n, p in lora.items() if "lora_B" in n)  # = the base
    with pytest.raises(ConfigError, match="per_role=true .* names no trainable role.*trainable_targets"):
        load_trainable_model(cfg, seed=0, trainable_targets=None)
    plain, _ = load_trainable_model(ModelConfig(path=str(tiny_model_dir), device="cpu",
                                                lora=LoraConfig(enabled=True, r=2)), seed=0, trainable_targets=["wolf"])
    assert list(plain.peft_config) == ["default"]  # without per_role: one adapter, as before


def test_per_role_needs_lora_and_gpu_backbones_refuse_it():
    from ajet.backbones.registry import backbone_problems
    from ajet.config.schema import AjetConfig, LoraConfig, ModelConfig
    from ajet.config.validate import validate

    cfg = AjetConfig(model=ModelConfig(lora=LoraConfig(per_role=True)))
    assert any(key == "model.lora.per_role" and "model.lora.enabled=true" in msg
               for key, msg in validate(cfg, require_workflow=False))
    on = AjetConfig(model=ModelConfig(lora=LoraConfig(enabled=True, per_role=True)))
    assert not [k for k, _ in validate(on, require_workflow=False) if k == "model.lora.per_role"]
    for backbone in ("trinity", "verl"):
        assert any(key == "model.lora.per_role" and "--backbone=debug" in msg
                   for key, msg in backbone_problems(backbone, on))
    # the sft and dpo recipes train the active adapter only: per_role is refused there
    staged = AjetConfig(model=ModelConfig(lora=LoraConfig(enabled=True, per_role=True)))
    staged.pipeline.stages = ["sft", "grpo"]
    assert any(key == "model.lora.per_role" and "sft and dpo" in msg
               for key, msg in validate(staged, require_workflow=False))


# ---------------------------------------------------------------------- sessions and roles
class ModelsEngine(EngineFeatures):
    """A scripted engine that serves models by name, as the local engine does."""

    supports_models = True

    def __init__(self, inner, adapters=()):
        self.inner = inner
        self.adapters = tuple(adapters)
        self.models: list = []
        self.policy_version = inner.policy_version

    def check_model(self, model):
        if model != INITIAL_MODEL and model not in self.adapters:
            raise ValueError(f"model={model!r} is not served by this engine")

    async def generate(self, prompt_ids, params, *, model=None):
        self.models.append(model)
        return await self.inner.generate(prompt_ids, params)


def models_session(trainable, adapters, script):
    from test_tuner_fakes import make_session

    session, engine, tracker, _ = make_session(script, trainable_targets=set(trainable))
    session.engine = ModelsEngine(engine, adapters)
    session._adapters = frozenset(adapters)
    return session, session.engine, tracker


MESSAGES = [{"role": "user", "content": "Who is the wolf?"}]


def test_each_call_names_the_model_of_its_role():
    from ajet.tuner import ModelTuner

    session, engine, tracker = models_session(["wolf", "seer"], ["wolf", "seer"], ["a"] * 5)
    tuner = ModelTuner(session, trainable_targets=["wolf", "seer"])
    models = {role: tuner.register_model(role) for role in ("wolf", "seer", "critic")}
    models["villager"] = tuner.register_model("villager", default_model=INITIAL_MODEL)
    assert tuner.register_model("villager", default_model=INITIAL_MODEL) is not None  # the same again: fine
    for role in ("wolf", "seer", "critic", "villager"):
        asyncio.run(models[role](MESSAGES))
    asyncio.run(tuner(MESSAGES))  # the tuner's own role ("default"): not trainable here, the policy
    assert engine.models == ["wolf", "seer", None, INITIAL_MODEL, None]
    assert [(c.role, c.trainable) for c in tracker.calls] == [
        ("wolf", True), ("seer", True), ("critic", False), ("villager", False), ("default", False)]


def test_register_model_errors_name_the_role_and_the_fix(tmp_path):
    from test_tuner_fakes import make_session

    from ajet.tuner import ModelTuner

    session, _, _ = models_session(["wolf"], ["wolf"], [])
    tuner = ModelTuner(session, trainable_targets=["wolf"])
    tuner.register_model("villager", default_model=INITIAL_MODEL)
    with pytest.raises(ValueError, match=r"role 'villager' is already registered with default_model='initial'.*"
                                         r"tuner.get_model\('villager'\).*another role name"):
        tuner.register_model("villager", default_model=str(tmp_path))
    with pytest.raises(ValueError, match="role 'villager' is already registered"):
        tuner.register_model("villager")
    with pytest.raises(ValueError, match=r"role 'hunter': default_model='/no/such/dir': .*not served"):
        tuner.register_model("hunter", default_model="/no/such/dir")
    tuner.register_model("hunter", default_model=INITIAL_MODEL)  # a failed registration left nothing behind

    # An engine that serves the policy alone (trinity / verl's vLLM): the role and the fix.
    plain, _, _, _ = make_session([], trainable_targets={"wolf"})
    with pytest.raises(ValueError, match=r"role 'villager': default_model='initial' is served by the debug "
                                         r"backbone's engine only.*AgentScope chat model.*--backbone=debug"):
        ModelTuner(plain, trainable_targets=["wolf"]).register_model("villager", default_model=INITIAL_MODEL)


def test_roles_train_their_own_adapters_through_the_real_stack(tiny_model_dir):
    """load_trainable_model(per_role) -> LocalEngine -> EngineRollout.open_episode -> tuner: each
    role's call is sampled from its own adapter, a default model's call from the base."""
    from ajet.config.schema import (
        AjetConfig,
        LoraConfig,
        ModelConfig,
        RolloutConfig,
        WorkflowConfig,
    )
    from ajet.engine.local import LocalEngine
    from ajet.rollout.engine_rollout import EngineRollout
    from ajet.training.model import load_trainable_model
    from ajet.workflow import Workflow, WorkflowTask

    cfg = ModelConfig(path=str(tiny_model_dir), device="cpu", lora=LoraConfig(enabled=True, r=2, per_role=True))
    model, tokenizer = load_trainable_model(cfg, seed=0, trainable_targets=["wolf", "seer"])
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
    with LocalEngine(model, tokenizer, prefix_cache_tokens=4096) as engine:
        run = AjetConfig(rollout=RolloutConfig(temperature=1.0, max_tokens=4),
                         workflow=WorkflowConfig(trainable_targets=["wolf", "seer"]))
        factory = EngineRollout(run, engine, tokenizer, Workflow(), model_max_len=512)  # episodes opened by hand
        handle = factory.open_episode("e0", WorkflowTask(task_id="t0", main_query="q"))
        tuner = handle.tuner
        roles = {r: tuner.register_model(r) for r in ("wolf", "seer")}
        roles["villager"] = tuner.register_model("villager", default_model=INITIAL_MODEL)

        async def play():
            return await asyncio.gather(*(m(MESSAGES) for m in roles.values()))

        asyncio.run(play())
        calls = {c.role: c for c in handle.tracker.calls}
        factory.close()
    assert {r: c.trainable for r, c in calls.items()} == {"wolf": True, "seer": True, "villager": False}
    for role, adapter in (("wolf", "wolf"), ("seer", "seer"), ("villager", None)):
        call = calls[role]
        expected = reference_logprobs(model, call.prompt_ids, call.completion_ids, adapter)
        assert max(abs(a - b) for a, b in zip(call.completion_logprobs, expected, strict=True)) < 1e-4
