"""Grammar-constrained decoding: tool calls and structured output that always parse.

A `Grammar` (in `SamplingParams.grammar`) is the engine-agnostic description of what a
completion may be, in the Lark dialect of llguidance (https://github.com/guidance-ai/llguidance;
chosen over xgrammar after measuring both on the bundled tokenizer: a mask in 0.06-0.5 ms
against ~0.7 ms, a 3 MB wheel with no dependencies against one that pulls triton).
The local engine runs a `Constraint` per constrained sequence:

- **Forced tokens.** Where the grammar allows one continuation (the markup around a call,
  a JSON key, closing braces), the engine takes the canonical tokens of those bytes without
  sampling (llguidance's fast-forward tokens), or the only allowed token. They are flagged
  in `Completion.forced`, and the tracker makes them context: like the forced start of a
  `tool_choice` call, the model did not choose them, so they carry no policy gradient.
  A run of them (`Constraint.forced_run`) is forwarded in one go, not one decode step per
  token (`ajet.engine.batch_prefill.jump_forced_runs`).
- **Choices.** Elsewhere the logits of tokens the grammar forbids are masked out before
  sampling, and the recorded logprob is the token's logprob under the *unmasked* model (as
  `ajet.engine.sampling` defines it), which is exactly what the trainer recomputes. The
  masking is a sampling-time filter, like top-k: training raises the chosen valid token's
  probability in the full vocabulary, so the model also learns to write valid calls alone.
- **End.** When the grammar is complete the next token is EOS, forced.

Builders: `tool_call_grammar` (hermes `<tool_call>` markup, one JSON-schema-valid call of
the named tool, or of any offered tool; or several, one per line), `json_grammar`
(`response_format`) and `call_or_json_grammar` (either: tool_choice "auto" with a format).
JSON is written with the separators `json.dumps` uses (", " and ": ") and no other
whitespace, so a constrained call tokenises like the history that later renders it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ajet.engine.sampling import TokenChoice, choose_token, logprob_temperature, sample_index

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ajet.engine.base import SamplingParams

# llguidance's JSON options: the separators of `json.dumps`, no free whitespace.
_JSON_LAYOUT = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


class GrammarError(ValueError):
    """A grammar that does not compile, or a completion the grammar cannot continue."""


@dataclass(frozen=True)
class Grammar:
    """What a completion may be, in llguidance's Lark dialect (`%json {schema}` embeds a
    JSON schema). `what` names it in messages ("a call of calculate"). With a `trigger`,
    the completion is free text until it writes the trigger, and the grammar then covers
    what follows it."""

    lark: str
    what: str = "grammar"
    trigger: str = ""


_OPEN = '<tool_call>\n{"name": '
_CLOSE = "}\n</tool_call>"


def tool_call_grammar(tools: list[dict[str, Any]], name: str | None = None, *, triggered: bool = False,
                      schemas: Collection[str] | None = None, several: bool = False) -> Grammar:
    """One hermes tool call, `<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>`,
    with ARGS valid under the tool's parameter schema: of the tool `name`, or of any of
    `tools` when `name` is None (tool_choice "required"). `triggered`: free text until the
    model writes `<tool_call>`, then the call (tool_choice "auto"). `schemas`: the tools whose
    arguments follow their schema (None: all); the others' are any JSON object. `several`:
    more calls may follow, each on its own line (parallel_tool_calls); else one, then the end."""
    trigger = "<tool_call>" if triggered else ""
    calls, rules, what = _calls(tools, name, schemas, several, skip=len(trigger))
    return Grammar("\n".join([f"start: {calls}", *rules]) + "\n", what, trigger)


def call_or_json_grammar(tools: list[dict[str, Any]], schema: dict[str, Any] | None, *, strict: bool = False,
                         schemas: Collection[str] | None = None, several: bool = False) -> Grammar:
    """Tool calls (as `tool_call_grammar`) or one JSON value valid under `schema` (any JSON
    object when None): tool_choice "auto" with a `response_format`, whose format applies to a
    reply that is not a call."""
    calls, rules, what = _calls(tools, None, schemas, several)
    answer = json.dumps(_schema(schema, strict))
    lark = "\n".join(["start: calls | answer", f"calls: {calls}", f"answer: %json {answer}", *rules])
    return Grammar(lark + "\n", f"{what} or JSON under the response_format schema")


def _calls(tools: list[dict[str, Any]], name: str | None, schemas: Collection[str] | None, several: bool,
           skip: int = 0) -> tuple[str, list[str], str]:
    """(the expression of the calls, the rules it uses, what it is): the first call's opening
    without its first `skip` characters (a trigger already written)."""
    specs = {_function(t).get("name"): _function(t) for t in tools}
    if name is not None and name not in specs:
        raise GrammarError(f"tool {name!r} is not among the offered tools {sorted(specs, key=str)}")
    chosen = [specs[name]] if name is not None else list(specs.values())
    rules = []
    for i, fn in enumerate(chosen):
        head = json.dumps(fn["name"], ensure_ascii=False) + ', "arguments": '
        follows = schemas is None or fn["name"] in schemas
        arguments = _schema(fn.get("parameters"), strict=True) if follows else _schema(None)
        rules.append(f"call_{i}: {_literal(head)} %json {json.dumps(arguments)}")
    rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(chosen))))
    block = f"call {_literal(_CLOSE)}"
    calls = f"{_literal(_OPEN[skip:])} {block}"
    if several:
        calls += f" ({_literal(chr(10) + _OPEN)} {block})*"
    what = f"a call of {name}" if name is not None else f"a call of one of {sorted(specs, key=str)}"
    return calls, rules, what


def json_grammar(schema: dict[str, Any] | None, strict: bool = False) -> Grammar:
    """One JSON value valid under `schema` (any JSON object when None): `response_format`.
    `strict` (OpenAI's `json_schema.strict`): an object admits only its `properties`."""
    body = _schema(schema, strict)
    return Grammar(f"start: %json {json.dumps(body)}\n", "JSON under the response_format schema")


def _schema(schema: dict[str, Any] | None, strict: bool = False) -> dict[str, Any]:
    """`schema` with ajet's JSON layout. `strict` (tool arguments): an object schema that
    does not say otherwise admits no keys beyond its `properties`, as OpenAI's strict
    function calling does; a 135M model otherwise invents keys the tool cannot take."""
    out = _closed(schema) if strict else dict(schema) if isinstance(schema, dict) and schema else {}
    out = out or {"type": "object"}
    out["x-guidance"] = {**_JSON_LAYOUT, **(out.get("x-guidance") or {})}
    return out


def _closed(schema: Any) -> Any:
    """A copy of `schema` whose objects with `properties` admit no other keys (unless the
    schema says otherwise), down through properties, items and alternatives."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (_closed(v) if k in ("items", "anyOf", "oneOf", "allOf", "prefixItems") else v)
           for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: _closed(v) for k, v in schema["properties"].items()}
        out.setdefault("additionalProperties", False)
    return out


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", tool)


def _literal(text: str) -> str:
    """A Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)


class GrammarRuntime:
    """Compiles grammars against one tokenizer (built once, lazily: ~1.5 s for 49k tokens)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: set[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos: int | None = eos if eos in eos_token_ids or not eos_token_ids else min(eos_token_ids)
        self._ll: Any = None
        self._lock = threading.Lock()

    def _lltokenizer(self) -> Any:
        with self._lock:
            if self._ll is None:
                import llguidance.hf

                self._ll = llguidance.hf.from_tokenizer(
                    self._tokenizer, n_vocab=self.vocab_size, eos_token=self.eos
                )
            return self._ll

    def start(self, grammar: Grammar) -> Constraint:
        """A fresh matcher for one completion; `GrammarError` when the grammar is invalid."""
        import llguidance

        if not isinstance(grammar, Grammar):
            raise GrammarError(f"SamplingParams.grammar must be an ajet Grammar, got {type(grammar).__name__}")
        matcher = llguidance.LLMatcher(
            self._lltokenizer(), llguidance.LLMatcher.grammar_from_lark(grammar.lark), log_level=0
        )
        if matcher.is_error():
            raise GrammarError(f"{grammar.what}: the grammar does not compile: {matcher.get_error()}")
        return Constraint(matcher, grammar, self.vocab_size, self.eos, self._tokenizer)


class Constraint:
    """The grammar state of one completion: picks each next token, then `accept`s it."""

    def __init__(self, matcher: Any, grammar: Grammar, vocab_size: int, eos: int | None,
                 tokenizer: Any = None) -> None:
        self._matcher = matcher
        self._grammar = grammar
        self._vocab_size = vocab_size
        self._eos = eos
        self._tokenizer = tokenizer
        self._queued: list[int] = []  # fast-forward tokens not taken yet
        self._bitmask: Any = None
        # False: free text until the trigger is written; None: gave up (see `watch`).
        self.active: bool | None = not grammar.trigger

    def watch(self, text: str) -> None:
        """Before the trigger: activate once the completion's `text` contains it. Text the
        same token wrote after the trigger is fed to the grammar; when the grammar refuses
        it, the completion stays free (the parser then judges the call)."""
        if self.active is not False:
            return
        at = text.find(self._grammar.trigger)
        if at < 0:
            return
        rest = text[at + len(self._grammar.trigger):]
        ids = self._tokenizer.encode(rest, add_special_tokens=False) if rest else []
        if ids and self._matcher.try_consume_tokens(ids) != len(ids):
            self.active = None
            return
        self.active = True

    def choose(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> TokenChoice:
        """The next token from one row of logits: forced, or sampled among allowed tokens.
        The recorded logprob is under the unmasked model (what the trainer recomputes).
        Per-row work runs in numpy: on a busy 2-core machine torch's threaded ops over ~49k
        values took 16-70 ms each (threads waiting on each other), numpy's ~0.1 ms."""
        import numpy as np

        row = logits.detach().float().numpy().astype(np.float64) / logprob_temperature(params)
        top = row.max()
        logprobs = row - (top + np.log(np.exp(row - top).sum()))
        if not np.isfinite(logprobs).all():
            raise FloatingPointError("non-finite logits (the model produced NaN/inf)")
        forced = self._forced()
        if forced is None:
            allowed = self._allowed()
            forced = int(allowed[0]) if len(allowed) == 1 else None
        if forced is not None:
            return TokenChoice(forced, float(logprobs[forced]), forced=True)
        token = int(allowed[self._pick(logprobs[allowed], params, generator)])
        return TokenChoice(token, float(logprobs[token]))

    @staticmethod
    def _pick(logprobs: Any, params: SamplingParams, generator: torch.Generator) -> int:
        """Index of the token sampled among the allowed ones (their logprobs at the logprob
        temperature, a numpy array). Plain sampling runs in numpy: torch's threaded
        reductions over ~49k values took 16-70 ms each on a busy 2-core machine."""
        import numpy as np
        import torch

        if params.temperature == 0:
            return int(np.argmax(logprobs))
        if params.top_k or params.top_p < 1.0:  # the filters live in ajet.engine.sampling
            return choose_token(torch.from_numpy(logprobs * logprob_temperature(params)), params, generator).token_id
        scaled = logprobs * (logprob_temperature(params) / params.temperature)
        return sample_index(torch.from_numpy(np.exp(scaled - scaled.max())), generator)

    def accept(self, token: int) -> None:
        """Advance past `token` (sampled or forced); EOS after the grammar's end is accepted."""
        if self._matcher.is_stopped():
            return
        if self._queued and self._queued[0] == token:
            self._queued.pop(0)
        else:
            self._queued.clear()
        if not self._matcher.consume_token(token):
            raise GrammarError(
                f"{self._grammar.what}: token {token} does not continue the grammar: "
                f"{self._matcher.get_error()}"
            )

    def forced_run(self) -> list[int]:
        """The tokens the grammar forces next, before its next choice (llguidance's
        fast-forward tokens): none before the trigger, after giving up, or at the grammar's
        end (EOS comes next, from the model's own logits)."""
        if not self.active or self._matcher.is_stopped():
            return []
        if not self._queued:
            self._queued = list(self._matcher.compute_ff_tokens())
        return list(self._queued)

    def _forced(self) -> int | None:
        if self._matcher.is_stopped():
            return self._eos
        if not self._queued:
            self._queued = list(self._matcher.compute_ff_tokens())
        return self._queued[0] if self._queued else None

    def _allowed(self) -> Any:
        """The ids (a numpy int64 array) of the tokens the grammar allows next. Unpacked with
        numpy: a few small torch ops per token cost ~50 ms on a busy 2-core machine (thread
        pool contention), numpy's single-threaded unpacking well under 1 ms."""
        import llguidance.torch
        import numpy as np

        if self._bitmask is None:
            self._bitmask = llguidance.torch.allocate_token_bitmask(1, self._vocab_size)
        llguidance.torch.fill_next_token_bitmask(self._matcher, self._bitmask, 0)
        bits = np.unpackbits(self._bitmask.numpy().view(np.uint8), bitorder="little")
        allowed = np.flatnonzero(bits[: self._vocab_size])
        if not len(allowed):
            raise GrammarError(f"{self._grammar.what}: no token can continue: {self._matcher.get_error()}")
        return allowed
