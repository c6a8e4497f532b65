"""Training throughput of one GRPO update: ajet (merge + tree packing) vs TRL's GRPOTrainer loss.

Both sides train on the same episodes with the same model (the bundled SmolLM2-135M, fp32,
CPU). TRL trains agents one LLM call per row (prompt + completion, padded batches), so its
input is the one-sample-per-call view of the episodes; ajet merges each episode's calls and
tree-packs the group's shared prompt. tokens/s counts the *logical* tokens of the workload
(sum over calls of prompt + completion length) so both columns measure the same work.

    python -m scripts.bench.train [--workloads grpo-n8-shared-prompt,react-8-turns] [--repeats 2] [--json FILE]

Needs TRL for the comparison (`pip install 'ajet[bench]'`; `make bench` does it).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from scripts.bench.context import WORKLOADS, Renderer, samples_of


def ours_update(model, samples, micro_batch_tokens: int) -> float:
    """One ajet update (forward + loss + backward + AdamW step) over tree-packed samples."""
    from ajet.algorithms.losses import policy_loss
    from ajet.config.schema import LossAgg
    from ajet.context.pack import loss_weights, pack_samples
    from ajet.forward.packed import forward_packed

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    start = time.perf_counter()
    packed = pack_samples(samples, loss_weights(samples, LossAgg.token_mean), micro_batch_tokens)
    optimizer.zero_grad(set_to_none=True)
    for seq in packed:
        new, _ = forward_packed(model, seq)
        loss, _ = policy_loss(
            new, torch.tensor(seq.entry_old_logprob), torch.tensor(seq.entry_advantage),
            torch.tensor(seq.entry_weight), clip_low=0.2, clip_high=0.2,
        )
        loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def trl_rows(per_call) -> list[dict]:
    """Each call as TRL sees it: prompt ids (everything before the completion) and completion ids."""
    rows = []
    for sample in per_call:
        first = sample.loss_mask.index(1)
        last = len(sample.loss_mask) - 1 - sample.loss_mask[::-1].index(1)
        rows.append({
            "prompt": sample.input_ids[:first],
            "completion": sample.input_ids[first:last + 1],
            "old": sample.old_logprobs[first:last + 1],
            "advantage": sample.advantage[first] if sample.advantage else 0.5,
        })
    return rows


def trl_trainer(model, tokenizer, micro_batch: int):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), per_device_train_batch_size=micro_batch,
        num_generations=micro_batch, use_cpu=True, report_to=[], bf16=False, beta=0.0,
        loss_type="bnpo", logging_steps=1000, gradient_checkpointing=False,
    )
    return GRPOTrainer(
        model=model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)], args=args,
        train_dataset=Dataset.from_list([{"prompt": "x"}] * micro_batch), processing_class=tokenizer,
    )


def trl_update(trainer, rows: list[dict], micro_batch: int, pad_id: int) -> float:
    """TRL's own GRPO loss (compute_loss) over padded micro-batches, then one AdamW step."""
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-6)
    # Set by Trainer.train() in a real run; we drive compute_loss directly and scale ourselves.
    trainer.current_gradient_accumulation_steps = 1
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    for i in range(0, len(rows), micro_batch):
        batch = rows[i:i + micro_batch]
        p_len = max(len(r["prompt"]) for r in batch)
        c_len = max(len(r["completion"]) for r in batch)
        prompt = torch.full((len(batch), p_len), pad_id)
        prompt_mask = torch.zeros((len(batch), p_len), dtype=torch.long)
        completion = torch.full((len(batch), c_len), pad_id)
        completion_mask = torch.zeros((len(batch), c_len), dtype=torch.long)
        old = torch.zeros((len(batch), c_len))
        for j, r in enumerate(batch):  # prompts left-padded, completions right-padded (as TRL does)
            prompt[j, p_len - len(r["prompt"]):] = torch.tensor(r["prompt"])
            prompt_mask[j, p_len - len(r["prompt"]):] = 1
            completion[j, :len(r["completion"])] = torch.tensor(r["completion"])
            completion_mask[j, :len(r["completion"])] = 1
            old[j, :len(r["old"])] = torch.tensor(r["old"])
        inputs = {
            "prompt_ids": prompt, "prompt_mask": prompt_mask, "completion_ids": completion,
            "completion_mask": completion_mask, "old_per_token_logps": old,
            "advantages": torch.tensor([r["advantage"] for r in batch]),
            "num_items_in_batch": completion_mask.sum(),
        }
        loss = trainer.compute_loss(trainer.model, inputs)
        (loss * len(batch) / len(rows)).backward()
    optimizer.step()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="grpo-n8-shared-prompt,react-8-turns")
    parser.add_argument("--repeats", type=int, default=2, help="best of N timed updates per side")
    parser.add_argument("--micro-batch", type=int, default=4, help="TRL rows per micro-batch")
    parser.add_argument("--micro-batch-tokens", type=int, default=4096, help="ajet tokens per packed sequence")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ajet.models.resolve import bundled_checkpoint

    path = bundled_checkpoint()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    try:
        trainer = trl_trainer(model, tokenizer, args.micro_batch)
    except ImportError:
        print("TRL is not installed: pip install 'ajet[bench]' (make bench installs it)", file=sys.stderr)
        trainer = None
    renderer = Renderer(tokenizer)
    results: dict[str, dict[str, float]] = {}
    for name in args.workloads.split(","):
        episodes = WORKLOADS[name](renderer, random.Random(0))
        per_call, merged, _distinct = samples_of(episodes)
        for s in per_call + merged:  # a non-zero advantage everywhere so every token trains
            s.advantage = [0.5 * m for m in s.loss_mask]
        logical = sum(len(s.input_ids) for s in per_call)
        ours = min(ours_update(model, merged, args.micro_batch_tokens) for _ in range(args.repeats))
        row = {"logical_tokens": logical, "ours_s": ours, "ours_tok_s": logical / ours}
        if trainer is not None:
            rows = trl_rows(per_call)
            trl = min(trl_update(trainer, rows, args.micro_batch, tokenizer.pad_token_id) for _ in range(args.repeats))
            row.update({"trl_s": trl, "trl_tok_s": logical / trl, "speedup": trl / ours})
        results[name] = row

    header = f"{'workload':<16}{'tokens':>8}{'ajet s':>9}{'ajet tok/s':>12}{'TRL s':>9}{'TRL tok/s':>11}{'speedup':>9}"
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        trl_cols = (f"{r['trl_s']:>9.2f}{r['trl_tok_s']:>11.0f}{r['speedup']:>8.2f}x" if "trl_s" in r else f"{'n/a':>9}{'n/a':>11}{'n/a':>9}")
        print(f"{name:<16}{r['logical_tokens']:>8}{r['ours_s']:>9.2f}{r['ours_tok_s']:>12.0f}{trl_cols}")
    if args.json:
        args.json.write_text(json.dumps({"train": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
