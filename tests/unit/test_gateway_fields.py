"""The gateway's fields are declared once (ajet/tuner/fields.py): the request model, the refusals,
the sampling checks and docs/gateway.md's table all come from that declaration."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from ajet.config.schema import RolloutConfig
from ajet.tuner.errors import InvalidRequestError
from ajet.tuner.fields import (
    FIELDS,
    PROTOCOL_FIELDS,
    SAMPLING_FIELDS,
    Status,
    markdown_table,
    refused_field,
)
from ajet.tuner.openai_compat import ChatCompletionRequest
from ajet.tuner.request_sampling import resolve_sampling

BODY = {"messages": [{"role": "user", "content": "hi"}]}


def test_docs_gateway_md_holds_the_table_rendered_from_the_declaration(script: Any) -> None:
    gen, blocks = script("tools.docs_gateway"), script("tools.docs_blocks")
    for page, generated in gen.blocks().items():
        text = page.read_text()
        assert blocks.fill(text, gen.MODULE, generated) == text, (
            f"{page.name}'s field table is stale: run .venv/bin/python -m scripts.tools.docs_gateway")
    table = markdown_table()
    assert all(f"`{spec.name}`" in table for spec in FIELDS)


def test_the_request_model_has_the_honoured_fields_and_the_protocol_all_declared() -> None:
    honoured = {spec.name for spec in FIELDS if spec.status is Status.HONOURED}
    assert set(ChatCompletionRequest.model_fields) == honoured
    assert PROTOCOL_FIELDS == {spec.name for spec in FIELDS} and len(PROTOCOL_FIELDS) == len(FIELDS)
    request = ChatCompletionRequest.model_validate({**BODY, "logprobs": True})
    assert set(request.sampling_overrides()) == {spec.name for spec in SAMPLING_FIELDS}
    for spec in FIELDS:
        if spec.status is Status.REFUSED:
            assert refused_field({**BODY, spec.name: "x"}) == (spec.name, f"{spec.name}: {spec.why}")


def _outside(spec: Any) -> float:
    bounds = spec.bounds
    return bounds.high + 1 if math.isfinite(bounds.high) else bounds.low - (0 if bounds.low_open else 1)


@pytest.mark.parametrize("spec", [s for s in SAMPLING_FIELDS if s.bounds is not None], ids=lambda s: s.name)
def test_a_bound_is_one_check_over_http_and_through_the_session(spec: Any) -> None:
    value: Any = _outside(spec)
    if spec.name == "logit_bias":
        value = {"7": value}
    elif spec.parse.__name__ in ("integer", "top_k"):
        value = int(value)
    with pytest.raises(ValidationError) as over_http:
        ChatCompletionRequest.model_validate({**BODY, spec.name: value})
    with pytest.raises(InvalidRequestError) as in_session:
        resolve_sampling(RolloutConfig(), {spec.name: value})
    message = str(in_session.value)
    assert "out of range" in message and message in str(over_http.value)
    assert in_session.value.param == spec.name


def test_max_completion_tokens_wins_when_both_are_sent() -> None:
    """As vLLM and SGLang (issue 71): OpenAI's newer name is the one a client means."""
    rollout = RolloutConfig(max_tokens=100)
    assert resolve_sampling(rollout, {"max_tokens": 9, "max_completion_tokens": 4}).max_tokens == 4
    assert resolve_sampling(rollout, {"max_tokens": 9, "max_completion_tokens": None}).max_tokens == 9
    assert resolve_sampling(rollout, {"max_completion_tokens": 7}).max_tokens == 7
