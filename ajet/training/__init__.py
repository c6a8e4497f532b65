"""What every training recipe (RL, SFT, DPO) shares: the run directory, the step loop with its
metrics, progress, LR schedule and checkpoints, the optimizer, the trainable model, validation,
and the `setup -> train -> cleanup` runner. Recipes are thin: they build their data and say
what one step does."""
