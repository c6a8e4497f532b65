"""The trainer's forward over tree-packed sequences (torch): one forward per packed sequence
with tree positions and masks (`packed`), attention cut into segments (`tree_attention`, planned
by the cost model in `cascade`), and log-probs of the trained tokens without the full
[tokens x vocab] logits (`logprobs`). The token bookkeeping it runs on is `ajet.context`, which
imports no torch."""
