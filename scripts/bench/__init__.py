"""The benchmarks: what a change costs or gains, measured, never asserted (`make bench`, `make
bench-learning`; docs/results/). Each is a module run from the repository's root, e.g.
`.venv/bin/python -m scripts.bench.engine --help`; what several of them share is in `common`.

Speed: engine (decode, prefix cache, adapters, choices; llamacpp is its llama.cpp reference),
thread_pools, context (merging and packing), train (a training step against TRL), sft_step,
optimizer, checkpoint, memory (with memory_marks), tool_choice, sandbox, hostile_body,
episode_api, suite (the test suite). Learning: learning (the regression bench), learning_curve,
vs_trl, distill.
"""
