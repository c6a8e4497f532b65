"""The binary half of the Tinker wire: what the pinned SDK (tinker 0.38) sends and expects as
protobuf rather than JSON.

- `POST /api/v1/forward_backward` arrives as a `ForwardBackwardRequest` proto
  (`Content-Type: application/x-protobuf`; zstd-compressed only when the server's client config
  says `proto_compress_fwdbwd`, which this service never does);
- a `ForwardBackwardOutput` or a `SampleResponse` is retrieved as proto: the SDK asks for it with
  `Accept: application/x-protobuf` and refuses a JSON body for these two types.

The message classes are the SDK's own generated ones (`tinker.proto.tinker_public_pb2`), so the
encoding is the SDK's by construction. Everything else of the API is JSON (`ajet.tinker_service.routes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from ajet.tinker_service.errors import BadRequestError, NotServedError

PROTOBUF = "application/x-protobuf"
_NUMPY = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass
class DatumIn:
    """One datum of a forward(_backward): its input tokens and its `loss_fn_inputs` as arrays."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackwardIn:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    data: list[DatumIn]
    forward_only: bool


def decode_forward_backward(body: bytes) -> ForwardBackwardIn:
    """The request of `POST /api/v1/forward_backward` (the SDK's proto)."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # protobuf raises its DecodeError, a plain Exception subclass
        raise BadRequestError(f"forward_backward: the body is not a ForwardBackwardRequest proto ({exc})") from exc
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():  # v2 wins where both are set, as the SDK expects
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = []
    for i, datum in enumerate(msg.data):
        if len(datum.model_input_spans) or len(datum.loss_fn_input_spans):
            raise NotServedError("provenance spans (Datum.with_provenance, StableReinforce's sequence ids)")
        tokens: list[int] = []
        for chunk in datum.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise NotServedError(f"model_input chunks of type {kind!r} (datum {i}): only encoded text is served")
            tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
        inputs = {name: _array(tensor, f"datum {i} loss_fn_inputs[{name!r}]")
                  for name, tensor in datum.loss_fn_inputs.items()}
        data.append(DatumIn(tokens, inputs))
    return ForwardBackwardIn(msg.model_id, msg.seq_id, msg.loss_fn, config, data, msg.forward_only)


def _array(msg: pb.Tensor, what: str) -> np.ndarray:
    dtype = _NUMPY.get(msg.dtype)
    if dtype is None:
        raise BadRequestError(f"{what}: tensor dtype {pb.DType.Name(msg.dtype)} is not float32/int64/int32")
    shape = list(msg.shape)
    if msg.WhichOneof("encoding") == "sparse_csr":
        if len(shape) != 2:
            raise BadRequestError(f"{what}: a sparse CSR tensor needs a 2-D shape, got {shape}")
        csr = msg.sparse_csr
        values = np.frombuffer(csr.values, dtype=dtype)
        crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
        cols = np.frombuffer(csr.col_indices, dtype=np.int64)
        dense = np.zeros(shape, dtype=dtype)
        rows = np.repeat(np.arange(shape[0]), np.diff(crow))
        dense[rows, cols] = values
        return dense
    array = np.frombuffer(msg.dense, dtype=dtype)
    if shape and int(np.prod(shape)) != array.size:
        raise BadRequestError(f"{what}: shape {shape} does not hold {array.size} values")
    return (array.reshape(shape) if shape else array).copy()  # writable: torch takes it as is


# ----------------------------------------------------------------------------- answers
def encode_forward_backward_output(outputs: Sequence[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A `ForwardBackwardOutput` proto: one ArrayRecord holding every datum's fields (1-D float32)."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    record = msg.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(outputs))
    for name in outputs[0] if outputs else ():
        arrays = [np.ascontiguousarray(out[name], dtype=np.float32).reshape(-1) for out in outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        record.fields[name].CopyFrom(pb.BatchedTensor(
            data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32))
    return msg.SerializeToString()


@dataclass
class SequenceOut:
    tokens: list[int]
    logprobs: list[float]
    stop: bool  # stopped (EOS, a stop sequence) rather than at max_tokens
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # topk_sample_logprobs, per token


def encode_sample_response(sequences: Sequence[SequenceOut], prompt_logprobs: Sequence[float] | None,
                           topk: int = 0) -> bytes:
    """A `SampleResponse` proto; `prompt_logprobs` with NaN where none was computed (position 0)."""
    msg = pb.SampleResponse()
    for seq in sequences:
        out = msg.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if seq.stop else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(seq.logprobs, dtype=np.float32).tobytes())
        if topk:
            ids = np.full((len(seq.tokens), topk), -1, dtype=np.int32)
            lps = np.full((len(seq.tokens), topk), -np.inf, dtype=np.float32)
            for row, alternatives in enumerate(seq.top):
                for col, (token, logprob) in enumerate(alternatives[:topk]):
                    ids[row, col], lps[row, col] = token, logprob
            out.topk_sampled_logprobs.CopyFrom(pb.TopkLogprobs(
                token_ids=ids.tobytes(), logprobs=lps.tobytes(), k=topk, length=len(seq.tokens)))
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return msg.SerializeToString()
