"""Run outputs: metrics (JSONL, TensorBoard, wandb/swanlab), token records, progress, viewer, report."""
