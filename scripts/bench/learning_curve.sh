#!/usr/bin/env bash
# Reproduce the learning curve of docs/log/2026-11-22_adder_learning_curve.md: GRPO on the one-digit adder
# (tutorial/example_function_workflow) from the bundled SmolLM2-135M-Instruct, fixed seed,
# validation on 24 held-out additions every 5 steps. Prints the validation table and writes
# the report (PNG plots) under the run dir; copies the success curve to docs/.
#
#   bash scripts/bench/learning_curve.sh [KEY=VALUE overrides...]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-experiments/learning_curve}
rm -rf "$OUT"
start=$(date +%s)
"$PY" tutorial/example_function_workflow/adder.py project.exp_dir="$OUT" project.seed=0 \
  logging.quiet=true trainer.total_steps=16 trainer.val_every=4 "$@"
end=$(date +%s)
echo "wall-clock: $((end - start)) s"
"$PY" -m ajet.cli.main report "$OUT/adder" --out "$OUT/adder/report"
"$PY" - "$OUT/adder/metrics.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'step':>5} {'val success':>12} {'val reward':>11} {'pass@2':>7}")
for r in rows:
    if r["split"] == "val":
        print(f"{r['step']:>5} {r['val/success/rate']:>12.3f} {r['val/reward/mean']:>11.3f} {r.get('val/pass@2', float('nan')):>7.3f}")
PYEOF
mkdir -p docs/img
cp "$OUT/adder/report/success.png" docs/img/learning_curve_success.png
cp "$OUT/adder/report/reward.png" docs/img/learning_curve_reward.png
