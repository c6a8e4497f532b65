"""Measure the cost model of `ajet.forward.cascade` on this machine: ATTENTION_PAIR, SEGMENT.

A packed tree of T tokens (a shared prompt and k equal branches; 4 trained tokens per
branch, so the LM head is a small constant) is trained (fwd + bwd) twice for several k:
once as one attention segment under the 4-D tree mask (T^2 attention pairs) and once cut
into k + 1 segments (prompt causal, each branch against prompt + itself). Every run
forwards the same T tokens through the linear layers; only the attention pairs P and the
segment count S change, so the CPU seconds are fitted by least squares as

    seconds = c0 + pair * P + segment * S,

and the per-token cost is taken from a chain of T tokens (one causal segment) less its
attention. The constants are printed in tokens (the model's unit) for the cascade
module. CPU time of this process is used (not wall time), with one thread by default, so
that other jobs on the machine disturb the numbers less; they are noisy all the same.

    python -m scripts.tools.calibrate_cascade [--tokens 768] [--threads 1] [--repeats 1]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import torch

from ajet.algorithms.losses import policy_loss
from ajet.config.schema import LossAgg
from ajet.context.loss_weights import loss_weights
from ajet.context.pack import pack_samples
from ajet.context.types import Sample
from ajet.forward.packed import forward_packed, forward_plan


def tree(tokens: int, branches: int, prompt: int, vocab: int, seed: int = 0):
    """One packed sequence: a `prompt`-token root and `branches` equal branches below it."""
    rng = random.Random(seed)
    length = (tokens - prompt) // max(branches, 1)
    head = [rng.randrange(vocab) for _ in range(prompt)]
    samples = []
    for b in range(max(branches, 1)):
        ids = head + [rng.randrange(vocab) for _ in range(length if branches else tokens - prompt)]
        mask = [0] * (len(ids) - 4) + [1] * 4
        samples.append(Sample(input_ids=ids, loss_mask=mask, old_logprobs=[-1.0] * len(ids),
                              advantage=[1.0] * len(ids), episode_id=f"e{b}"))
    (packed,) = pack_samples(samples, loss_weights(samples, LossAgg.token_mean), 1 << 30)
    return packed


def cpu_seconds(model, packed, split: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.process_time()
        new, _ = forward_packed(model, packed, split=split)
        loss, _ = policy_loss(new, torch.tensor(packed.entry_old_logprob), torch.tensor(packed.entry_advantage),
                              torch.tensor(packed.entry_weight), clip_low=0.2, clip_high=0.2)
        loss.backward()
        best = min(best, time.process_time() - start)
    return best


def pairs_and_segments(packed, split: str) -> tuple[float, int]:
    """Attention pairs SDPA computes for the plan (causal kernel: half), and segments."""
    from ajet.forward.tree_attention import tree_layout

    layout = tree_layout(forward_plan(packed, split=split), packed.parents, "cpu")
    pairs = 0.0
    for seg in layout.segments:
        k = sum(hi - lo for lo, hi in seg.keys)
        pairs += k * (k + 1) / 2 if seg.mask is None else k * (seg.stop - seg.start)
    return pairs, len(layout.segments)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=768)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from ajet.models.resolve import bundled_checkpoint

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(bundled_checkpoint(), dtype=torch.float32).train()
    vocab = model.config.vocab_size
    chain = tree(args.tokens, 0, 64, vocab)
    cpu_seconds(model, chain, "never", 1)  # warm-up
    chain_s = cpu_seconds(model, chain, "never", args.repeats)
    rows = []  # (pairs, segments, seconds)
    for k in (2, 6, 16, 48):
        packed = tree(args.tokens, k, 64, vocab)
        for split in ("never", "always"):
            p, s = pairs_and_segments(packed, split)
            sec = cpu_seconds(model, packed, split, args.repeats)
            rows.append((p, s, sec))
            print(f"k={k:3d} {split:6s} pairs={p:10.0f} segments={s:3d} cpu={sec:6.2f}s", file=sys.stderr)
    x = torch.tensor([[1.0, p, s] for p, s, _ in rows], dtype=torch.float64)
    y = torch.tensor([sec for *_, sec in rows], dtype=torch.float64)
    c0, pair, segment = torch.linalg.lstsq(x, y[:, None]).solution[:, 0].tolist()
    chain_pairs = args.tokens * (args.tokens + 1) / 2
    token = (chain_s - pair * chain_pairs) / args.tokens
    print(f"threads={args.threads} T={args.tokens}: token {token * 1e3:.2f} ms, "
          f"pair {pair * 1e6:.3f} us, segment {segment * 1e3:.1f} ms (c0 {c0:.2f} s)")
    print(f"ATTENTION_PAIR = {pair / token:.2e}  # tokens")
    print(f"SEGMENT = {segment / token:.2f}  # tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
