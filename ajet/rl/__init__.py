"""The RL recipe (GRPO family, PPO-style clipping, on-policy distillation), beside `sft/` and
`dpo/`: `recipe.py` (setup -> train -> cleanup, and one step), `update.py` (packed sequences in,
one optimizer step out), `samples.py` (episodes -> trainable samples with advantages). The
debug backbone runs it in one process; trinity and verl run their own trainers."""
