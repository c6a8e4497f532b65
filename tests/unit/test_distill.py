"""On-policy distillation: the advantages are teacher - student logprobs on the student's own
token ids, the packed teacher scoring equals scoring each call alone, the teacher never trains,
and a teacher that cannot score the student's tokens is refused with the reason."""

from __future__ import annotations

import copy
import json
import math

import httpx
import pytest
import torch

from ajet.algorithms.distill import distill_advantages
from ajet.context.types import Sample
from ajet.errors import ConfigError
from ajet.training.adapters import role_adapters
from ajet.training.teacher import (
    TEACHER_ADAPTER,
    AdapterTeacher,
    EndpointTeacher,
    LocalTeacher,
    check_same_tokenizer,
    tokenizer_differences,
)
from tests.unit.tiny_models import tiny_llama

TEMPERATURE = 0.7

# A merged two-call sample of one episode: call 1 = P1 -> C1; call 2's prompt extends it with a
# tool result T (untrained), call 2 = P1 C1 T -> C2. Both completions are trained.
P1, C1, T, C2 = [1, 5, 9, 13, 2], [20, 21, 22], [3, 7, 8], [30, 31, 32, 33]


def merged_sample(old: float = -2.0) -> Sample:
    ids = P1 + C1 + T + C2
    mask = [0] * len(P1) + [1] * len(C1) + [0] * len(T) + [1] * len(C2)
    old_lp = [(old - 0.1 * i) if m else 0.0 for i, m in enumerate(mask)]
    return Sample(input_ids=ids, loss_mask=mask, old_logprobs=old_lp, episode_id="e0", group_id="g",
                  num_calls=2, segments=[(5, 8), (11, 15)])


def sibling_sample() -> Sample:
    """Another episode of the same task: it shares P1 and the first completion token."""
    ids = P1 + [20, 40, 41]
    mask = [0] * len(P1) + [1, 1, 1]
    return Sample(input_ids=ids, loss_mask=mask, old_logprobs=[-1.0 if m else 0.0 for m in mask],
                  episode_id="e1", group_id="g")


def call_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    """The model's logprobs of `completion` after `prompt`, one plain causal forward of that call."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].float() / TEMPERATURE
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[len(prompt) + i - 1, tok]) for i, tok in enumerate(completion)]


def test_advantages_are_teacher_minus_student_on_a_merged_multi_turn_sample() -> None:
    teacher_model = tiny_llama()
    sample = merged_sample()
    teacher = LocalTeacher(teacher_model, temperature=TEMPERATURE, max_tokens=4096)
    scores = teacher.score([sample])

    # By hand: each call scored on its own, as the student's engine saw it.
    first = call_logprobs(teacher_model, P1, C1)
    second = call_logprobs(teacher_model, P1 + C1 + T, C2)
    expected_teacher = [0.0] * len(P1) + first + [0.0] * len(T) + second
    old = list(sample.old_logprobs)
    metrics = distill_advantages([sample], scores, reward_coef=0.0)
    for t, m in enumerate(sample.loss_mask):
        want = expected_teacher[t] - old[t] if m else 0.0
        assert sample.advantage[t] == pytest.approx(want, abs=1e-4), t
    trained = [t for t, m in enumerate(sample.loss_mask) if m]
    kl = sum(old[t] - expected_teacher[t] for t in trained) / len(trained)
    assert metrics["distill/reverse_kl"] == pytest.approx(kl, abs=1e-4)
    assert metrics["distill/tokens"] == len(trained)
    agreement = sum(min(1.0, math.exp(expected_teacher[t] - old[t])) for t in trained) / len(trained)
    assert metrics["distill/agreement"] == pytest.approx(agreement, abs=1e-4)


def test_the_reward_advantage_is_mixed_in_by_reward_coef() -> None:
    sample = merged_sample()
    sample.advantage = [0.5 if m else 0.0 for m in sample.loss_mask]
    teacher = [[-1.0] * len(sample.input_ids)]
    old = list(sample.old_logprobs)
    distill_advantages([sample], teacher, reward_coef=2.0)
    for t, m in enumerate(sample.loss_mask):
        assert sample.advantage[t] == pytest.approx((-1.0 - old[t] + 1.0) if m else 0.0)


def test_a_nan_teacher_logprob_is_refused_and_an_impossible_token_is_floored() -> None:
    sample = merged_sample()
    with pytest.raises(ValueError, match="NaN"):
        distill_advantages([sample], [[float("nan")] * len(sample.input_ids)])
    distill_advantages([sample], [[float("-inf")] * len(sample.input_ids)])
    assert all(math.isfinite(a) for a in sample.advantage)


def test_packed_teacher_scoring_equals_scoring_each_call_alone() -> None:
    teacher_model = tiny_llama()
    samples = [merged_sample(), sibling_sample()]
    packed = LocalTeacher(teacher_model, temperature=TEMPERATURE, max_tokens=4096).score(samples)
    # One tree for both samples: the shared prefix is forwarded once.
    alone = LocalTeacher(teacher_model, temperature=TEMPERATURE, max_tokens=0).score(samples)
    first, second = call_logprobs(teacher_model, P1, C1), call_logprobs(teacher_model, P1 + C1 + T, C2)
    sibling = call_logprobs(teacher_model, P1, [20, 40, 41])
    want = [[0.0] * 5 + first + [0.0] * 3 + second, [0.0] * 5 + sibling]
    for got in (packed, alone):
        for row, expected in zip(got, want, strict=True):
            assert row == pytest.approx(expected, abs=1e-4)


def test_the_teacher_never_changes_while_the_student_trains() -> None:
    student = tiny_llama()
    teacher = LocalTeacher(copy.deepcopy(student), temperature=1.0, max_tokens=4096)
    before = {k: v.clone() for k, v in teacher.model.state_dict().items()}
    student.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=0.05)
    sample = merged_sample()
    for _ in range(3):
        distill_advantages([sample], teacher.score([sample]))
        logits = student(torch.tensor([sample.input_ids])).logits[0]
        logp = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(sample.input_ids[1:])[:, None])[:, 0]
        loss = -(torch.tensor(sample.advantage[1:]) * logp).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert all(torch.equal(before[k], v) for k, v in teacher.model.state_dict().items())
    assert not any(p.requires_grad for p in teacher.model.parameters())
    assert any(not torch.equal(before[k], v) for k, v in student.state_dict().items())


def test_an_adapter_teacher_shares_the_base_and_never_trains(tmp_path) -> None:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    # The teacher: an adapter of the same base with other weights, saved in peft format.
    source = get_peft_model(tiny_llama(), copy.deepcopy(config))
    with torch.no_grad():
        for name, param in source.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn_like(param) * 0.3)
    source.save_pretrained(tmp_path / "teacher")
    standalone = copy.deepcopy(source).merge_and_unload().eval()

    student = get_peft_model(tiny_llama(), copy.deepcopy(config))
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=0.05)
    base_params = sum(p.numel() for p in student.parameters())
    teacher = AdapterTeacher(student, tmp_path / "teacher", temperature=TEMPERATURE, max_tokens=4096)
    assert role_adapters(student) == ["default"] and TEACHER_ADAPTER in student.peft_config
    # No second copy of the base: only the adapter's weights were added.
    added = sum(p.numel() for p in student.parameters()) - base_params
    assert 0 < added < base_params / 10
    sample = merged_sample()
    scores = teacher.score([sample])
    want = LocalTeacher(standalone, temperature=TEMPERATURE, max_tokens=4096).score([sample])
    assert scores[0] == pytest.approx(want[0], abs=1e-4)
    assert student.active_adapter == "default"
    teacher_before = {n: p.clone() for n, p in student.named_parameters() if f".{TEACHER_ADAPTER}." in n}
    student_before = {n: p.clone() for n, p in student.named_parameters() if ".default." in n}
    assert all(p.requires_grad for n, p in student.named_parameters() if ".default." in n)
    distill_advantages([sample], scores)
    student.train()
    logits = student(input_ids=torch.tensor([sample.input_ids])).logits[0]
    logp = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(sample.input_ids[1:])[:, None])[:, 0]
    (-(torch.tensor(sample.advantage[1:]) * logp).sum()).backward()
    optimizer.step()
    after = dict(student.named_parameters())
    assert all(torch.equal(v, after[n]) and not after[n].requires_grad for n, v in teacher_before.items())
    assert any(not torch.equal(v, after[n]) for n, v in student_before.items())
    teacher.close()
    assert TEACHER_ADAPTER not in student.peft_config


# ---------------------------------------------------------------------- tokenizers
class Tok:
    def __init__(self, vocab: dict[str, int], eos: str = "</s>", extra: tuple[str, ...] = ()) -> None:
        self.vocab, self.eos_token, self.bos_token, self.unk_token = vocab, eos, None, None
        self.additional_special_tokens = list(extra)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


def test_a_teacher_with_another_tokenizer_is_refused_naming_what_differs() -> None:
    vocab = {"a": 0, "b": 1, "</s>": 2}
    assert tokenizer_differences(Tok(vocab), Tok(dict(vocab))) == []
    other = Tok({"a": 0, "b": 2, "</s>": 1, "c": 3}, eos="<|end|>", extra=("<tool>",))
    with pytest.raises(ConfigError) as err:
        check_same_tokenizer(other, Tok(vocab), where="distill.teacher=/x")
    text = str(err.value)
    assert "distill.teacher=/x" in text and "4 tokens vs the student's 3" in text
    assert "'b': 2 vs 1" in text and "eos_token: '<|end|>' vs the student's '</s>'" in text
    assert "<tool>" in text


# ---------------------------------------------------------------------- endpoint teacher
class FakeChatTokenizer:
    """Renders a probe prompt and tokenizes it into the tiny model's small vocabulary."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "|".join(m["content"] for m in messages)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1 + (ord(c) % 60) for c in text]}


def vllm_like(model: torch.nn.Module, *, prompt_logprobs: bool = True, tokenize_offset: int = 0):
    """An httpx transport answering like vLLM: /models, /tokenize, and /completions with
    `prompt_logprobs` (None first, then {token id: {logprob, rank, decoded_token}})."""
    tok = FakeChatTokenizer()

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "teacher-7b"}]})
        body = json.loads(request.content)
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": [i + tokenize_offset for i in tok(body["prompt"])["input_ids"]]})
        assert path == "/v1/completions" and body["model"] == "teacher-7b" and body["prompt_logprobs"] == 0
        ids = body["prompt"]
        choice: dict = {"text": "x", "index": 0}
        if prompt_logprobs:
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            choice["prompt_logprobs"] = [None] + [
                {str(tok_id): {"logprob": float(logp[i - 1, tok_id]), "rank": 1, "decoded_token": "?"}}
                for i, tok_id in enumerate(ids) if i > 0]
        return httpx.Response(200, json={"choices": [choice]})

    return httpx.MockTransport(handler)


def test_an_endpoint_teacher_scores_like_the_same_model_in_process() -> None:
    model = tiny_llama()
    endpoint = EndpointTeacher("http://teacher:8000/v1", FakeChatTokenizer(), transport=vllm_like(model))
    assert endpoint.model == "teacher-7b"
    samples = [merged_sample(), sibling_sample()]
    local = LocalTeacher(model, temperature=1.0, max_tokens=4096).score(samples)
    for got, want in zip(endpoint.score(samples), local, strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    endpoint.close()


def test_an_endpoint_without_prompt_logprobs_is_refused() -> None:
    with pytest.raises(ConfigError, match="must return prompt logprobs"):
        EndpointTeacher("http://teacher:8000/v1", FakeChatTokenizer(),
                        transport=vllm_like(tiny_llama(), prompt_logprobs=False))


def test_an_endpoint_with_another_tokenizer_is_refused() -> None:
    with pytest.raises(ConfigError, match="tokenizer differs"):
        EndpointTeacher("http://teacher:8000/v1", FakeChatTokenizer(),
                        transport=vllm_like(tiny_llama(), tokenize_offset=1))


# ---------------------------------------------------------------------- config and --dry-run
def distill_conf(tmp_path, extra: str = ""):
    (tmp_path / "agent.py").write_text("class W: pass\n")
    (tmp_path / "train.jsonl").write_text('{"question": "1+1?"}\n')
    path = tmp_path / "run.yaml"
    path.write_text("workflow: {target: agent.py:W}\ntask_reader: {jsonl: {train_path: train.jsonl}}\n"
                    "algorithm: {name: distill}\n" + extra)
    return path


def problems_of(path, *overrides: str) -> str:
    from ajet.config import load_config

    with pytest.raises(ConfigError) as err:
        load_config(path, list(overrides))
    return str(err.value)


def test_distill_config_errors_name_the_key_and_the_fix(tmp_path) -> None:
    from ajet.config import load_config

    conf = distill_conf(tmp_path)
    assert "distill.teacher" in problems_of(conf) and "required for distillation" in problems_of(conf)
    assert "http:// or https://" in problems_of(conf, "distill.teacher=ftp://x/v1")
    text = problems_of(conf, "distill.teacher=http://t:8000/v1", "distill.reward_coef=0.5", "rollout.n=1")
    assert "rollout.n" in text and "reward_coef" in text
    text = problems_of(conf, "distill.teacher=http://t:8000/v1", "rollout.dynamic_sampling.enabled=true")
    assert "rollout.dynamic_sampling.enabled" in text and "learns from every episode" in text
    text = problems_of(conf, "algorithm.name=grpo", "distill.teacher=http://t:8000/v1")
    assert "distill.teacher" in text and "algorithm.name=distill" in text
    # A relative teacher directory is relative to the YAML, like the data paths.
    (tmp_path / "teacher").mkdir()
    cfg = load_config(distill_conf(tmp_path, "distill: {teacher: teacher}\n"))
    assert cfg.distill.teacher == str((tmp_path / "teacher").resolve())
    assert load_config(conf, ["distill.teacher=http://t:8000/v1"]).distill.teacher == "http://t:8000/v1"


def test_dry_run_checks_the_teacher_directory(tmp_path) -> None:
    from ajet.cli.preflight import check_teacher
    from ajet.config import load_config

    conf = distill_conf(tmp_path)
    cfg = load_config(conf, [f"distill.teacher={tmp_path / 'missing'}"])
    with pytest.raises(ConfigError, match="no such directory"):
        check_teacher(cfg)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="not a checkpoint directory"):
        check_teacher(load_config(conf, [f"distill.teacher={tmp_path / 'empty'}"]))
    student, teacher = tmp_path / "student", tmp_path / "teacher"
    for path, vocab in ((student, 100), (teacher, 200)):
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"vocab_size": vocab, "eos_token_id": 2}))
    cfg = load_config(conf, [f"distill.teacher={teacher}", f"model.path={student}"])
    with pytest.raises(ConfigError, match="vocab_size: 200 vs the student's 100"):
        check_teacher(cfg)
    (teacher / "config.json").write_text(json.dumps({"vocab_size": 100, "eos_token_id": 2}))
    assert "a checkpoint" in check_teacher(cfg)


def test_gpu_backbones_refuse_distillation(tmp_path) -> None:
    from ajet.backbones.registry import backbone_problems
    from ajet.config import load_config

    cfg = load_config(distill_conf(tmp_path), ["distill.teacher=http://t:8000/v1"])
    for backbone in ("trinity", "verl"):
        problems = dict(backbone_problems(backbone, cfg))
        assert "runs on the debug backbone only" in problems["algorithm.name"]


def test_a_distill_config_can_be_evaluated_and_staged(tmp_path) -> None:
    """`ajet eval` and a pipeline's eval stages run a distill config's other stages."""
    from ajet.config import load_config
    from ajet.config.validate import single_stage_config

    conf = distill_conf(tmp_path, "pipeline: {stages: [eval, distill, eval]}\n")
    cfg = load_config(conf, ["distill.teacher=http://t:8000/v1"])
    assert single_stage_config(cfg, "eval").distill.teacher == "http://t:8000/v1"
    assert single_stage_config(cfg, "distill").algorithm.name == "distill"
