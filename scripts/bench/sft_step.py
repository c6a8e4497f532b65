"""Time (and optionally profile) the SFT steps of a config: where a `make demo` SFT step goes.

Builds the config's SFT stage as `ajet` does (demonstrations, coreset, schedule, model with its
gradient checkpointing), then times its first steps in this process: the whole optimizer step
(`sft_step`), and the forward + backward of the first step's packed sequence under each
attention plan of the tree-packed forward (`ajet.forward.cascade`) in fp32 and under bf16
autocast. With --profile, the op table of one more step (torch profiler).

    python -m scripts.bench.sft_step [--conf tutorial/example_math_agent/math_agent.yaml] [--steps 4] [--profile]

Run it on a quiet machine: two torch processes on 2 cores slow each other by several times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conf", default="tutorial/example_math_agent/math_agent.yaml")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps timed (the first is a warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="forward+backward repeats per plan")
    parser.add_argument("--profile", action="store_true", help="print the op table of one more step")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, KEY=VALUE")
    args = parser.parse_args(argv)

    import torch

    from ajet.config.loader import load_config
    from ajet.context.pack import loss_weights, pack_samples
    from ajet.forward.packed import forward_packed
    from ajet.sft.recipe import SftRecipe
    from ajet.sft.step import sft_step
    from ajet.training.recipe import Closers

    with tempfile.TemporaryDirectory() as exp_dir:
        # The pipeline's SFT override of the demo (trainer.lr) does not change a step's time.
        cfg = load_config(args.conf, [f"project.exp_dir={exp_dir}", "logging.quiet=true", *args.overrides])
        recipe = SftRecipe(cfg)
        closers = Closers()
        recipe.setup(closers)
        steps = min(args.steps, len(recipe.schedule))

        def batch_samples(step: int) -> list:
            return [s for i in recipe.schedule[step - 1].indices for s in recipe.samples[i]]

        def one_step(step: int) -> float:
            start = time.perf_counter()
            sft_step(recipe.optimizer_step, batch_samples(step), loss_agg=cfg.context.loss_agg,
                     micro_batch_tokens=recipe._pack_tokens(), logits_chunk=cfg.trainer.logits_chunk_tokens,
                     step=step)
            return time.perf_counter() - start

        print(f"threads={torch.get_num_threads()} gradient_checkpointing={cfg.trainer.gradient_checkpointing}")
        times = [one_step(step) for step in range(1, steps + 1)]
        later = times[1:] or times
        print(f"optimizer steps (s): {' '.join(f'{t:.2f}' for t in times)}  median after the first: "
              f"{statistics.median(later):.2f}")

        samples = batch_samples(1)
        seq = pack_samples(samples, loss_weights(samples, cfg.context.loss_agg), recipe._pack_tokens())[0]
        model = recipe.model
        model.train()
        print(f"\nforward + backward of step 1's first packed sequence ({seq.num_tokens} tokens), s:")
        print(f"{'plan':<8} {'dtype':<6} {'best':>6} {'median':>7}")
        for split in ("cost", "always", "never"):
            for bf16 in (False, True):
                runs = []
                for _ in range(args.repeats):
                    model.zero_grad(set_to_none=True)
                    start = time.perf_counter()
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                        logp, _ = forward_packed(model, seq, split=split,
                                                 logits_chunk=cfg.trainer.logits_chunk_tokens)
                    logp.sum().backward()
                    runs.append(time.perf_counter() - start)
                print(f"{split:<8} {'bf16' if bf16 else 'fp32':<6} {min(runs):>6.2f} {statistics.median(runs):>7.2f}")
        model.zero_grad(set_to_none=True)

        if args.profile and steps < len(recipe.schedule):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                elapsed = one_step(steps + 1)
            print(f"\nstep {steps + 1} under the profiler: {elapsed:.2f} s")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
        closers.close_all()
    return 0


if __name__ == "__main__":
    from ajet.cli.allocator import use_jemalloc

    use_jemalloc()  # the allocator `ajet` runs on (AJET_ALLOCATOR=system: the C library's)
    sys.exit(main(sys.argv[1:]))
