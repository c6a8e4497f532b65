"""Learning per CPU-minute, end to end: ajet against TRL's GRPOTrainer on the math agent's tool
task (issue 28 §1). Both train the bundled model from the same start for the same wall budget on
the same CPU, one after the other; both are scored by the same evaluation at the same minutes.

    .venv/bin/pip install trl                                   # or: pip install -e '.[bench]'
    .venv/bin/python -m scripts.bench.vs_trl           # ajet, trl, trl_helped: 15 min each + evaluations
    .venv/bin/python -m scripts.bench.vs_trl --budget-min 1 --marks 0.5 --methods trl  # a smoke run

What is equal:
- the model (the bundled SmolLM2-135M-Instruct, fp32, full fine-tuning), the train tasks
  (tutorial/example_math_agent/train.jsonl), the system prompt and the `calculate` tool (its
  arithmetic and its errors: tutorial/example_math_agent/calculator_tool.py), the reward
  (ajet's `math` judge on the final answer: 1 when its \\boxed{} number is the task's answer);
- GRPO settings: 2 tasks x 8 completions a step, lr 1e-5, temperature 0.7 (math_agent_rl.yaml's);
- the wall budget: `--budget-min` of the step loop (model loading excluded), with the model written
  at each of `--marks` and at the end (`trainer.export_at_minutes` / `trainer.max_minutes` for
  ajet, a TrainerCallback for TRL);
- the evaluation: `ajet eval --conf math_agent_rl.yaml --split test` of every written model (the
  32 test tasks, phrasings train never shows, one episode each at the YAML's temperature).

ajet runs math_agent_rl.yaml as it is (GRPO alone, with its levers: the forced first tool call,
dynamic sampling, a curriculum, the fp16 engine with TIS). TRL gets its best fair settings, read
from its docs and issues:
- tool calling through `GRPOTrainer(tools=[calculate])` (TRL >= 0.26), which runs the tool and
  regenerates within one completion;
- SmolLM2's own chat template has no tools, so TRL refuses it ("The provided chat template does
  not support tool calling", and `add_response_schema` knows no schema for it). TRL is given the
  Qwen2.5 template it ships (`trl.chat_template_utils.qwen2_5_chat_template`): the same ChatML
  tokens SmolLM2 was trained on, and the same hermes `<tool_call>` markup that ajet renders for a
  template without tools (ajet.engine.chat), so the training prompts match the evaluation's;
- `max_completion_length=192`: ajet's episode may decode 3 calls of at most 64 new tokens
  (math_agent_rl.yaml's `rollout.max_tokens`, the agent's 3 model turns), so TRL's one completion
  with its tool turns gets the same 192 (a smoke run at 128 clipped 62 % of its completions);
- `beta=0` (no reference model: ajet's math_agent_rl.yaml has no KL either), `loss_type` TRL's
  default, CPU generation with transformers (vLLM has no CPU path here), gradient checkpointing.
TRL cannot force the first call to be a tool call, nor refill groups without signal.

`trl_helped` is TRL with two more levers, since plain TRL gets no signal on this task (its base
model made no tool call in any step of the runs in docs/log/2026-11-26_learning_vs_trl.md, so every reward was 0):
- the curriculum's start as its whole train set: the difficulty-1 tasks (one product or sum, 112
  of 256), which ajet's curriculum starts on and which are 22 of the 32 test tasks;
- a shaping reward beside the math judge, as TRL's own GRPO examples add a format reward:
  +0.2 when a `calculate` call ran, else +0.1 when the completion wrote the `<tool_call>` markup
  TRL could not parse. ajet's reward pays for the answer alone, so this favours TRL.

Writes OUT/bench_vs_trl.json and OUT/bench_vs_trl.md (test success against training minutes, per
method) and prints the table; `scripts/tools/docs_results.py` then regenerates docs/results/learning.md
from every committed bench_vs_trl.json. The goal (issue 28): ajet reaches TRL's success at the budget in
at most a third of the budget (with the default marks: ajet at 5 min >= TRL at 15 min).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scripts.bench.common import (
    AJET,
    REPO,
    child_env,
    eval_metric,
    fmt,
    markdown_table,
    read_jsonl,
    vector_flags,
)

EXAMPLE = REPO / "tutorial" / "example_math_agent"
CONF = EXAMPLE / "math_agent_rl.yaml"
TRLS = ("trl", "trl_helped")
METHODS = ("ajet", *TRLS)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="ajet,trl,trl_helped", help="comma-separated: ajet, trl, trl_helped")
    parser.add_argument("--budget-min", type=float, default=15.0, help="training wall minutes per method")
    parser.add_argument("--marks", default="5,10", help="minutes at which each method writes its model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exp-dir", type=Path, default=REPO / "experiments" / "bench_vs_trl")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "learning")
    parser.add_argument("--eval-only", action="store_true", help="evaluate the models an earlier run wrote")
    parser.add_argument("--train-only", action="store_true", help="train and write the models, evaluate nothing")
    parser.add_argument("--trl-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trl-helped", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def marks_of(text: str) -> list[float]:
    marks = sorted({float(m) for m in text.split(",") if m.strip()})
    if any(m <= 0 for m in marks):
        raise ValueError(f"--marks must be minutes > 0, got {text!r}")
    return marks


def mark_dir(root: Path, minutes: float) -> Path:
    return root / f"min_{minutes:g}"


# ---------------------------------------------------------------------- training


def train_ajet(args: argparse.Namespace, marks: list[float]) -> dict[float, Path]:
    """math_agent_rl.yaml's GRPO stage for the budget; {minutes: model dir}."""
    name = f"ajet_seed{args.seed}"
    run_dir = args.exp_dir / name / "stages" / "01_grpo"
    cmd = [*AJET, "--conf", str(CONF), "--backbone=debug",
           f"project.name={name}", f"project.exp_dir={args.exp_dir}", f"project.seed={args.seed}",
           "logging.quiet=true", "pipeline.stages=[grpo]", "trainer.total_steps=100000", "trainer.val_every=0",
           f"trainer.max_minutes={args.budget_min:g}",
           f"trainer.export_at_minutes=[{','.join(f'{m:g}' for m in marks)}]"]
    if not args.eval_only:
        run(cmd)
    models = {m: mark_dir(run_dir / "exports", m) for m in marks}
    models[args.budget_min] = run_dir / "final_model"
    return models


def train_trl(args: argparse.Namespace, marks: list[float], method: str = "trl") -> dict[float, Path]:
    """TRL's GRPOTrainer in a child process (its own OpenMP pool and memory); {minutes: model dir}."""
    out = args.exp_dir / f"{method}_seed{args.seed}"
    if not args.eval_only:
        run([sys.executable, "-m", __spec__.name, "--trl-child", "--budget-min", f"{args.budget_min:g}",
             "--marks", ",".join(f"{m:g}" for m in marks), "--seed", str(args.seed), "--exp-dir", str(out),
             *(["--trl-helped"] if method == "trl_helped" else [])])
    models = {m: mark_dir(out, m) for m in marks}
    models[args.budget_min] = out / "final_model"
    return models


def run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=child_env())


def trl_child(args: argparse.Namespace) -> None:
    """Train with TRL until the budget; write the model at each mark and at the end."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from ajet.judge.math_judge import MathJudge
    from ajet.models.resolve import resolve_model_path
    from ajet.workflow import WorkflowOutput, WorkflowTask
    from tutorial.example_math_agent.calculator_tool import SYSTEM_PROMPT, arithmetic

    def calculate(expression: str) -> str:  # TRL builds the tool's schema from the signature and docstring
        """Evaluate an arithmetic expression such as "12 * (3 + 4)".

        Args:
            expression: The arithmetic expression to evaluate.
        """
        return arithmetic(expression)

    judge = MathJudge()

    def math_reward(completions: list[list[dict[str, Any]]], answer: list[str], **_: Any) -> list[float]:
        """ajet's math judge on the last assistant message of each completion."""
        rewards = []
        for turns, truth in zip(completions, answer, strict=True):
            final = next((str(t.get("content") or "") for t in reversed(turns) if t.get("role") == "assistant"), "")
            task = WorkflowTask(task_id="t", main_query="", metadata={"answer": truth})
            rewards.append(judge.compute_reward(task, WorkflowOutput(metadata={"final_answer": final}))[0])
        return rewards

    rows = read_jsonl(EXAMPLE / "train.jsonl")
    if args.trl_helped:
        rows = [r for r in rows if r.get("difficulty") == 1]  # the curriculum's start (module docstring)
    print(f"trl: {len(rows)} train tasks{', helped' if args.trl_helped else ''}", flush=True)
    dataset = Dataset.from_list([{"prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                                             {"role": "user", "content": r["question"]}],
                                  "answer": str(r["answer"])} for r in rows])
    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = qwen2_5_chat_template  # see the module docstring: tools need it
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    out = args.exp_dir
    marks = marks_of(args.marks)

    class WallClock(TrainerCallback):
        """Writes the model at each mark, stops at the budget (minutes since training began)."""

        def __init__(self) -> None:
            self.start = 0.0
            self.pending = list(marks)

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            self.start = time.monotonic()

        def on_step_end(self, _args: Any, state: Any, control: Any, **k: Any) -> Any:
            minutes = (time.monotonic() - self.start) / 60
            for mark in [m for m in self.pending if m <= minutes]:
                save(mark_dir(out, mark))
                self.pending.remove(mark)
            print(f"trl step {state.global_step}: {minutes:.2f} min", flush=True)
            if minutes >= args.budget_min:
                control.should_training_stop = True
            return control

    def save(where: Path) -> None:
        model.save_pretrained(where)
        tokenizer.chat_template = original_template  # the evaluation renders with ajet's own rules
        tokenizer.save_pretrained(where)
        tokenizer.chat_template = qwen2_5_chat_template

    original_template = AutoTokenizer.from_pretrained(path).chat_template
    config = GRPOConfig(
        output_dir=str(out / "trainer"), use_cpu=True, seed=args.seed, max_steps=100_000,
        per_device_train_batch_size=16, num_generations=8, gradient_accumulation_steps=1,
        learning_rate=1e-5, beta=0.0, temperature=0.7, max_completion_length=192,
        max_tool_calling_iterations=2, gradient_checkpointing=True, logging_steps=1, save_strategy="no",
        report_to=[], bf16=False, dataloader_num_workers=0,
    )
    rewards = [math_reward, *([tool_shaping_reward] if args.trl_helped else [])]
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=rewards, args=config,
                          train_dataset=dataset, tools=[calculate], callbacks=[WallClock()])
    trainer.train()
    save(out / "final_model")


TOOL_ERROR = "error:"  # how the calculator's answer starts on a failure; TRL's own failures are {'error': ...}


def tool_shaping_reward(completions: list[list[dict[str, Any]]], **_: Any) -> list[float]:
    """trl_helped's shaping: 0.2 when a calculate call ran, 0.1 for unparsed <tool_call> markup, else 0."""
    rewards = []
    for turns in completions:
        results = [str(t.get("content") or "") for t in turns if t.get("role") == "tool"]
        if any(not r.startswith((TOOL_ERROR, "{'error'")) for r in results):
            rewards.append(0.2)
        elif any(t.get("role") == "assistant" and "<tool_call>" in str(t.get("content") or "") for t in turns):
            rewards.append(0.1)
        else:
            rewards.append(0.0)
    return rewards


# ---------------------------------------------------------------------- evaluation


def evaluate(args: argparse.Namespace, method: str, minutes: float, model: Path | None) -> float | None:
    """`ajet eval` of one model on the test split; its success rate (None when it was not written).
    A report already in the experiment dir is read, not made again: the name holds the seed, so
    another seed's run in the same dir is evaluated afresh."""
    name = f"{method}_seed{args.seed}_min_{minutes:g}"
    report = args.exp_dir / "eval" / "eval" / f"eval_{name}.json"  # RUN/eval/ of project.name=eval
    if model is not None and not model.is_dir():
        print(f"{method} at {minutes:g} min: {model} was not written (the run ended before it)", flush=True)
        return None
    if not report.is_file():
        cmd = [*AJET, "eval", "--conf", str(CONF), "--split", "test",
               "--name", name, f"project.exp_dir={args.exp_dir}", "project.name=eval", f"project.seed={args.seed}"]
        run([*cmd, *(["--model", str(model)] if model is not None else [])])
    return eval_metric(report)


def goal_text(curves: dict[str, dict[float, float | None]], budget: float) -> str:
    """Does ajet reach each TRL variant's success at the budget within a third of it?"""
    ajet = curves.get("ajet") or {}
    verdicts = []
    for trl in [m for m in TRLS if m in curves]:
        trl_end = curves[trl].get(budget)
        if trl_end is None or not ajet:
            verdicts.append(f"not judged against {trl}: both methods need a result at the budget")
            continue
        reached = [m for m, v in sorted(ajet.items()) if m > 0 and v is not None and v >= trl_end]
        if not reached:
            verdicts.append(f"missed: ajet never reached {trl}'s {trl_end:.3f} at {budget:g} min")
            continue
        verdict = "met" if reached[0] <= budget / 3 + 1e-9 else "missed"
        verdicts.append(f"{verdict}: ajet reached {trl}'s {trl_end:.3f} (at {budget:g} min) by {reached[0]:g} min")
    return "; ".join(verdicts) or "not judged: no TRL method ran"


def write(args: argparse.Namespace, curves: dict[str, dict[float, float | None]]) -> str:
    minutes = sorted({m for c in curves.values() for m in c})
    lines = markdown_table(["method", *(f"{m:g} min" for m in minutes)],
                           [[method, *(fmt(curve.get(m)) for m in minutes)] for method, curve in curves.items()],
                           right=range(1, len(minutes) + 1))
    goal = goal_text(curves, args.budget_min)
    text = "\n".join(lines) + f"\n\nGoal (ajet reaches TRL's success at the budget in <= 1/3 of it): {goal}\n"
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"date": time.strftime("%Y-%m-%d %H:%M"), "budget_min": args.budget_min, "seed": args.seed,
            "cpu_flags": vector_flags(), "curves": {k: {f"{m:g}": v for m, v in c.items()} for k, c in curves.items()},
            "goal": goal}
    (args.out / "bench_vs_trl.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / "bench_vs_trl.md").write_text(text)
    return text


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.trl_child:
        trl_child(args)
        return 0
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        print(f"error: unknown method(s) {unknown}; use {', '.join(METHODS)}", file=sys.stderr)
        return 2
    try:
        marks = [m for m in marks_of(args.marks) if m < args.budget_min]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if set(methods) & set(TRLS):
        try:
            import trl  # noqa: F401 - only checks that it is installed
        except ImportError:
            print("error: TRL is not installed: pip install trl (or pip install -e '.[bench]')", file=sys.stderr)
            return 2
    trained = {m: train_ajet(args, marks) if m == "ajet" else train_trl(args, marks, m) for m in methods}
    if args.train_only:
        print("\n".join(f"{m} at {t:g} min: {d}" for m, models in trained.items() for t, d in models.items()))
        return 0
    base = evaluate(args, "base", 0.0, None)
    curves = {m: {0.0: base, **{t: evaluate(args, m, t, d) for t, d in models.items()}}
              for m, models in trained.items()}
    print(write(args, curves))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
