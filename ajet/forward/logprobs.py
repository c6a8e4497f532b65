"""Token log-probs from final hidden states and the LM head, optionally a chunk of rows at a
time with recomputation in backward (the memory lever `trainer.logits_chunk_tokens`).

In the context layer because the packed forward (ajet/forward/packed.py) uses it and
the layers only point down (the algorithms import the context, not the reverse).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def token_logprobs(
    hidden: Tensor,
    head: Callable[[Tensor], Tensor],
    tokens: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of `tokens[i]` under `softmax(head(hidden[i]) / temperature)`, per row, in fp32
    (and the entropy of that distribution when `with_entropy`).

    `hidden` is [E, H] (the final hidden state at each loss entry), `head` the LM head.
    `chunk_size > 0` computes `chunk_size` rows at a time, and under autograd recomputes each
    chunk's logits in backward (`torch.utils.checkpoint`): at most one chunk's [chunk, vocab]
    logits and their gradient are alive, instead of several [E, vocab] copies (logits, fp32
    copy, log-softmax, its exp, their gradients), at the price of a second LM-head matmul.
    The values are those of the unchunked path: each row is computed alone either way.
    """
    if chunk_size <= 0 or hidden.shape[0] <= chunk_size:
        return _chunk_logprobs(hidden, head, tokens, temperature, with_entropy)
    from torch.utils.checkpoint import checkpoint

    recompute = torch.is_grad_enabled()
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        if recompute:
            logp, entropy = checkpoint(_chunk_logprobs, hidden[rows], head, tokens[rows], temperature,
                                       with_entropy, use_reentrant=False)
        else:
            logp, entropy = _chunk_logprobs(hidden[rows], head, tokens[rows], temperature, with_entropy)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)


def _chunk_logprobs(hidden: Tensor, head: Callable[[Tensor], Tensor], tokens: Tensor, temperature: float,
                    with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    entry = logp.gather(-1, tokens[:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return entry, entropy
