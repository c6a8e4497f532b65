"""The teacher of on-policy distillation (`algorithm.name: distill`, `distill.teacher`): what
scores each sampled token of the student's episodes on the very same token ids.

- `LocalTeacher`: a Hugging Face checkpoint (e.g. an earlier run's `final_model/`), loaded
  frozen beside the student (its weight memory is logged). A peft adapter directory without
  LoRA in the student is merged into a fresh copy of the student's base (`load_directory`).
- `AdapterTeacher`: with `model.lora.enabled`, a peft adapter of the student's base is loaded
  into the student's own peft model as the adapter `__teacher__` (not trainable, never in the
  optimizer, never saved): the teacher costs the adapter's weights only.
- `EndpointTeacher`: an OpenAI-compatible server that returns prompt logprobs (vLLM's
  `prompt_logprobs` on /v1/completions with token-id prompts), for a teacher too big for the
  trainer's machine.

Every teacher answers `score(samples)`: per sample, the teacher's logprob of each trained token
(0.0 elsewhere). The local ones pack the samples like the trainer's forward (`pack_samples`,
`forward_packed`): a prefix shared by several samples (a GRPO group's prompt, a merged
multi-turn history) is scored once. The tokenizers must agree (`check_same_tokenizer`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import httpx

from ajet.config.schema import AjetConfig
from ajet.context.pack import pack_samples
from ajet.context.types import Sample
from ajet.engine.served_models import check_directory, load_directory
from ajet.errors import ConfigError, TeacherUnavailable
from ajet.forward.packed import forward_packed
from ajet.retry import send_with_retries
from ajet.training.adapters import is_peft

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

M = TypeVar("M", bound="torch.nn.Module")
TEACHER_ADAPTER = "__teacher__"  # the adapter name of an AdapterTeacher (never a role's)
# Special-token attributes that must name the same tokens (pad is left out: ajet sets a missing
# pad token to eos itself, `ajet.models.load.load_tokenizer`).
_SPECIAL = ("bos_token", "eos_token", "unk_token")


class Teacher(Protocol):
    what: str

    def score(self, samples: Sequence[Sample]) -> list[list[float]]: ...

    def close(self) -> None: ...


def build_teacher(cfg: AjetConfig, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, *,
                  temperature: float) -> Teacher:
    """The teacher `distill.teacher` names, checked against the student (`model`, `tokenizer`):
    ConfigError naming `distill.teacher` and the fix when it cannot serve as one."""
    source = cfg.distill.teacher
    if "://" in source:
        return EndpointTeacher(source, tokenizer, model=cfg.distill.teacher_model, timeout_s=cfg.distill.timeout_s,
                               api_key=os.environ.get(cfg.distill.api_key_env, "") if cfg.distill.api_key_env else "",
                               temperature=temperature)
    path = Path(source).expanduser()
    try:
        check_directory(path, model)
    except ValueError as exc:
        raise ConfigError(f"distill.teacher: {exc}") from None
    teacher_tokenizer = _tokenizer_of(path)
    if teacher_tokenizer is not None:
        check_same_tokenizer(teacher_tokenizer, tokenizer, where=f"distill.teacher={path}")
    else:
        log.warning("distill.teacher=%s holds no tokenizer files; only its config's vocabulary size and "
                    "bos/eos ids were compared with the student's", path)
    max_tokens = cfg.trainer.micro_batch_tokens if cfg.context.tree_packing else 0
    chunk = cfg.trainer.logits_chunk_tokens
    if (path / "adapter_config.json").is_file() and is_peft(model):
        return AdapterTeacher(model, path, temperature=temperature, max_tokens=max_tokens, logits_chunk=chunk)
    try:
        teacher_model: torch.nn.Module = load_directory(path, model)  # Any: what transformers' Auto classes load
    except ValueError as exc:
        raise ConfigError(f"distill.teacher: {exc}") from None
    return LocalTeacher(teacher_model, temperature=temperature, max_tokens=max_tokens, logits_chunk=chunk,
                        what=f"the checkpoint {path}")


# ---------------------------------------------------------------------- tokenizers
def _tokenizer_of(path: Path) -> PreTrainedTokenizerBase | None:
    """The tokenizer saved in `path`, or None when it holds no tokenizer files."""
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def tokenizer_differences(teacher: PreTrainedTokenizerBase, student: PreTrainedTokenizerBase) -> list[str]:
    """What differs between two tokenizers' vocabularies and special tokens, in words ([] = same)."""
    out: list[str] = []
    theirs, ours = teacher.get_vocab(), student.get_vocab()
    if theirs != ours:
        out.append(f"vocabulary: {len(theirs)} tokens vs the student's {len(ours)}")
        differ = sorted(t for t in set(theirs) | set(ours) if theirs.get(t) != ours.get(t))
        shown = ", ".join(f"{t!r}: {theirs.get(t)} vs {ours.get(t)}" for t in differ[:5])
        out.append(f"{len(differ)} token(s) with other ids ({shown}{', ...' if len(differ) > 5 else ''})")
    for name in _SPECIAL:
        a, b = getattr(teacher, name, None), getattr(student, name, None)
        if a != b:
            out.append(f"{name}: {a!r} vs the student's {b!r}")
    extra_a = set(getattr(teacher, "additional_special_tokens", None) or [])
    extra_b = set(getattr(student, "additional_special_tokens", None) or [])
    if extra_a != extra_b:
        out.append(f"additional special tokens: only the teacher's {sorted(extra_a - extra_b)}, "
                   f"only the student's {sorted(extra_b - extra_a)}")
    return out


def check_same_tokenizer(teacher: PreTrainedTokenizerBase, student: PreTrainedTokenizerBase, *, where: str) -> None:
    """ConfigError listing the differences when the teacher would read other tokens than the
    student wrote (scoring is on the student's token ids)."""
    diff = tokenizer_differences(teacher, student)
    if diff:
        raise ConfigError(
            f"{where}: the teacher's tokenizer differs from the student's, so it cannot score the "
            f"student's token ids: {'; '.join(diff)}. Give a teacher of the same model family "
            "(the same tokenizer), e.g. an earlier final_model/ of this model")


# ---------------------------------------------------------------------- local teachers
class _PackedScorer:
    """Scores samples packed like the trainer's forward; subclasses give the module to forward."""

    what = "teacher"

    def __init__(self, *, temperature: float, max_tokens: int, logits_chunk: int) -> None:
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.logits_chunk = logits_chunk

    def _module(self) -> AbstractContextManager[torch.nn.Module]:  # the module to forward
        raise NotImplementedError

    def score(self, samples: Sequence[Sample]) -> list[list[float]]:
        import torch

        samples = list(samples)
        out = [[0.0] * len(s.input_ids) for s in samples]
        if not samples:
            return out
        # Each sample's trained positions, in the order its entries appear in a packed sequence.
        positions = [[t for t in range(1, len(s.input_ids)) if s.loss_mask[t]] for s in samples]
        cursor = [0] * len(samples)
        packed = pack_samples(samples, [[1.0] * len(s.input_ids) for s in samples], self.max_tokens)
        with torch.no_grad(), self._module() as module:
            for seq in packed:
                if not seq.num_entries:
                    continue
                logprobs, _ = forward_packed(module, seq, temperature=self.temperature,
                                             logits_chunk=self.logits_chunk)
                for value, index in zip(logprobs.float().tolist(), seq.entry_sample, strict=True):
                    out[index][positions[index][cursor[index]]] = float(value)
                    cursor[index] += 1
        return out

    def close(self) -> None:
        pass


class LocalTeacher(_PackedScorer):
    """A frozen model beside the student (a loaded checkpoint, or any module in tests)."""

    def __init__(self, model: torch.nn.Module, *, temperature: float, max_tokens: int = 0, logits_chunk: int = 0,
                 what: str = "a local model") -> None:
        super().__init__(temperature=temperature, max_tokens=max_tokens, logits_chunk=logits_chunk)
        model.eval()
        model.requires_grad_(False)
        self.model: torch.nn.Module | None = model  # None once closed
        self.what = what
        self.nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        log.info("distillation teacher: %s, frozen, %.2f GB of weights beside the student's", what, self.nbytes / 1e9)

    @contextmanager
    def _module(self) -> Iterator[torch.nn.Module]:
        yield _open(self.model)

    def close(self) -> None:
        self.model = None


class AdapterTeacher(_PackedScorer):
    """A peft adapter of the student's base, loaded into the student's peft model as
    `__teacher__`: scoring forwards the student's module with that adapter active (no second
    copy of the base). It is not trainable and was added after the optimizer was built."""

    def __init__(self, model: PeftModel, path: Path, *, temperature: float, max_tokens: int = 0,
                 logits_chunk: int = 0) -> None:
        super().__init__(temperature=temperature, max_tokens=max_tokens, logits_chunk=logits_chunk)
        self.model: PeftModel | None = model  # None once closed
        try:
            model.load_adapter(str(path), adapter_name=TEACHER_ADAPTER, is_trainable=False)
        except (RuntimeError, ValueError) as exc:  # size mismatch: trained on another base
            raise ConfigError(f"distill.teacher: the peft adapter {path} does not fit the student's base: {exc}") from None
        self.what = f"the peft adapter {path} on the student's base"
        self.nbytes = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                          if f".{TEACHER_ADAPTER}." in name)
        log.info("distillation teacher: %s (%.1f MB of adapter weights, no copy of the base)",
                 self.what, self.nbytes / 1e6)

    @contextmanager
    def _module(self) -> Iterator[torch.nn.Module]:
        model = _open(self.model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        previous, was_training = model.active_adapter, model.training
        model.eval()
        model.set_adapter(TEACHER_ADAPTER)
        try:
            yield model
        finally:
            model.set_adapter(previous)
            model.train(was_training)
            for param in trainable:  # set_adapter freezes every other adapter: undo it
                param.requires_grad_(True)
            for name, param in model.named_parameters():
                if f".{TEACHER_ADAPTER}." in name:
                    param.requires_grad_(False)

    def close(self) -> None:
        if self.model is not None and TEACHER_ADAPTER in getattr(self.model, "peft_config", {}):
            self.model.delete_adapter(TEACHER_ADAPTER)
        self.model = None


def _open(model: M | None) -> M:
    """A local teacher's model; a clear error once the teacher is closed."""
    if model is None:
        raise RuntimeError("the distillation teacher is closed: score() after close()")
    return model


# ---------------------------------------------------------------------- endpoint teacher
class EndpointTeacher:
    """A teacher behind an OpenAI-compatible server with prompt logprobs (vLLM): one
    /completions request per sample, `prompt` = its token ids, `prompt_logprobs: 0` (the
    logprob of each prompt token itself), `max_tokens: 1`.

    Checked when built: the server must answer with prompt logprobs, and when it offers vLLM's
    /tokenize, its tokenizer must give the student's ids for a probe text. vLLM scores the raw
    distribution (temperature 1); a student sampling at another temperature is warned about."""

    def __init__(self, url: str, tokenizer: PreTrainedTokenizerBase, *, model: str = "", timeout_s: float = 120.0,
                 api_key: str = "", temperature: float = 1.0, concurrency: int = 8,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.what = f"the endpoint {self.url}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)
        self.concurrency = concurrency
        self.model = model or self._first_model()
        self._check(tokenizer)
        if abs(temperature - 1.0) > 1e-6:
            log.warning("distill.teacher=%s scores at temperature 1 (prompt logprobs are the raw distribution) "
                        "while the student's logprobs are at rollout.temperature=%g: the advantage compares two "
                        "temperatures; sample at 1.0 for an exact reverse KL", self.url, temperature)
        log.info("distillation teacher: %s, model %r", self.url, self.model)

    def _first_model(self) -> str:
        try:
            reply = self.client.get(f"{self.url}/models")
            reply.raise_for_status()
            return str(reply.json()["data"][0]["id"])
        except Exception as exc:  # noqa: BLE001 - any failure means the same fix
            raise ConfigError(f"distill.teacher={self.url}: cannot list the endpoint's models ({exc}); check the "
                              "URL (it ends in /v1) and that the server runs, or set distill.teacher_model") from None

    def _check(self, tokenizer: PreTrainedTokenizerBase) -> None:
        probe = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 * 7?"}], tokenize=False,
                                              add_generation_prompt=True)
        ids: list[int] = tokenizer(probe, add_special_tokens=False)["input_ids"]  # BatchEncoding's values: Any
        try:
            values = self._prompt_logprobs(ids)
        except ValueError as exc:
            raise ConfigError(f"distill.teacher={self.url}: {exc}") from None
        if len(values) != len(ids):
            raise ConfigError(f"distill.teacher={self.url}: {len(values)} prompt logprobs for a prompt of {len(ids)} "
                              "tokens; the server must score the token ids it was sent")
        root = self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url
        try:
            reply = self.client.post(f"{root}/tokenize", json={"model": self.model, "prompt": probe,
                                                                "add_special_tokens": False})
        except Exception as exc:  # noqa: BLE001
            log.warning("distill.teacher=%s: cannot compare tokenizers (/tokenize: %s)", self.url, exc)
            return
        if reply.status_code != 200:
            log.warning("distill.teacher=%s offers no /tokenize (HTTP %d): its tokenizer cannot be compared "
                        "with the student's; make sure it is the same model family", self.url, reply.status_code)
            return
        theirs = list(reply.json().get("tokens") or [])
        if theirs != ids:
            first = next((i for i, (a, b) in enumerate(zip(theirs, ids, strict=False)) if a != b), min(len(theirs), len(ids)))
            raise ConfigError(
                f"distill.teacher={self.url}: the teacher's tokenizer differs from the student's: a probe prompt "
                f"tokenizes to {len(theirs)} ids there and {len(ids)} here, first differing at position {first}. "
                "Serve a teacher of the same model family (the same tokenizer)")

    def _prompt_logprobs(self, ids: list[int]) -> list[float | None]:
        """The server's logprob of each token of `ids` (None for the first); ValueError when the
        reply has none."""
        payload = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        try:  # scoring is idempotent: timeouts and 5xx are retried too, within a bounded wait
            reply = send_with_retries(lambda: self.client.post(f"{self.url}/completions", json=payload),
                                      what=f"distill.teacher {self.url}", idempotent=True)
        except httpx.TransportError as exc:
            raise TeacherUnavailable(f"distill.teacher {self.url} did not answer ({exc!r}), after retries for "
                                     "60 s: check that the server runs and is reachable, then --resume") from exc
        if reply.status_code != 200:
            raise ValueError(f"HTTP {reply.status_code} from /completions with prompt_logprobs: "
                             f"{reply.text[:300]}. The teacher endpoint must return prompt logprobs "
                             "(vLLM: `prompt_logprobs` on /v1/completions)")
        choices = reply.json().get("choices") or [{}]
        values = choices[0].get("prompt_logprobs")
        if not isinstance(values, list):
            raise ValueError("the reply has no prompt_logprobs: the teacher endpoint must return prompt "
                             "logprobs (vLLM does for `prompt_logprobs: 0` on /v1/completions)")
        out: list[float | None] = []
        for position, entry in enumerate(values):
            if entry is None:
                out.append(None)
                continue
            token = ids[position] if position < len(ids) else None
            value = entry.get(str(token)) if isinstance(entry, dict) else None
            if isinstance(value, dict):
                value = value.get("logprob")
            if not isinstance(value, int | float):
                raise ValueError(f"prompt_logprobs[{position}] has no logprob for the prompt's token {token}")
            out.append(float(value))
        return out

    def score(self, samples: Sequence[Sample]) -> list[list[float]]:
        def one(sample: Sample) -> list[float]:
            try:
                values = self._prompt_logprobs(list(sample.input_ids))
            except ValueError as exc:  # an answer without logprobs, or an error status after the retries
                raise TeacherUnavailable(f"distill.teacher {self.url}: {exc}") from exc
            if len(values) != len(sample.input_ids):
                raise ValueError(f"{len(values)} prompt logprobs for {len(sample.input_ids)} tokens")
            return [float(v) if (m and v is not None) else 0.0 for v, m in zip(values, sample.loss_mask, strict=True)]

        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            out = list(pool.map(one, samples))
        log.debug("teacher endpoint scored %d samples in %.1f s", len(out), time.monotonic() - start)
        return out

    def close(self) -> None:
        self.client.close()
