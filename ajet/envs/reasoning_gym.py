"""reasoning-gym (https://github.com/open-thought/reasoning-gym): any of its procedural datasets by
name, scored by the dataset's own `score_answer`.

A task is one item of a split's dataset (`create_dataset(id, seed=split seed, size=split size,
**env.args)[index]`). The prompt is reasoning-gym's system prompt (its answer-format instruction:
`<answer>...</answer>`) and the item's question; the answer is what reasoning-gym's own
`extract_answer` finds in the reply; the reward is `score_answer(answer, item)` (1.0 right, 0.0
wrong or missing, partial credit where the dataset gives it). The task's metadata holds the
dataset's name, config, seed and index: the workflow regenerates the item (cached per process)
instead of trusting a copy, and checks that it is the task's question.

The item's numeric metadata (e.g. basic_arithmetic's `num_terms`, `num_digits`) is copied into the
task's metadata, so ajet's curriculum can order by it (`task_reader.curriculum.key: num_terms`).
reasoning-gym's own curriculum (a dataset's `*Curriculum` class: global levels that change its
config) maps onto ajet's with `env.reasoning_gym.curriculum_levels: K`: each split's tasks come
evenly from levels 0..K-1, each task's metadata holds its `curriculum_level`, and
`task_reader.curriculum.key: curriculum_level` draws the low levels first. The levels are fixed
before the run and ajet's curriculum ramps by step; reasoning-gym's coaching raises a level when
the model's success passes a threshold, which is not mapped (docs/environments.md).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from ajet.config.schema import SPLIT_SEED_STRIDE, EnvConfig
from ajet.envs.base import (
    EnvError,
    Split,
    drop_train_questions,
    import_optional,
    reply_text,
    unknown_id,
)
from ajet.errors import TaskReaderError
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask


class ReasoningGymTask(BaseModel):
    """`task.metadata["env"]`: what rebuilds the task's item and scores a reply."""

    model_config = ConfigDict(extra="forbid")

    id: str
    args: dict[str, Any]
    seed: int
    size: int
    index: int
    answer_tag: str = "answer"
    score_untagged_reply: bool = False


def _reasoning_gym() -> Any:
    # ~2 s to import (all its datasets register at import): only where a reasoning-gym env is used.
    return import_optional("reasoning_gym", "reasoning-gym")


@functools.lru_cache(maxsize=32)
def _dataset(name: str, args_json: str, seed: int, size: int) -> Any:
    """One split's dataset (procedural: the same arguments give the same items), built once per process."""
    rg = _reasoning_gym()
    args = json.loads(args_json)
    known = rg.factory.DATASETS
    if name not in known:
        raise unknown_id("reasoning-gym dataset", name, known)
    try:
        return rg.create_dataset(name, **{**args, "seed": seed, "size": size})
    except (TypeError, ValueError, AssertionError) as exc:  # an unknown field, a value its validate() refuses
        fields = [f.name for f in dataclasses.fields(known[name][1]) if f.name not in ("seed", "size")]
        raise TaskReaderError(f"env.args={args} for reasoning-gym's {name}: {type(exc).__name__}: {exc}. "
                              f"Its config's fields: {', '.join(fields)}") from None


def system_prompt(name: str) -> str:
    """A name in reasoning_gym.utils.SYSTEM_PROMPTS, or the text itself."""
    prompts: dict[str, str] = _reasoning_gym().utils.SYSTEM_PROMPTS
    return prompts.get(name, name)


def level_args(name: str, args: dict[str, Any], levels: int) -> list[dict[str, Any]]:
    """The dataset's config at each of its curriculum's global levels 0..levels-1 (reasoning-gym's
    `*Curriculum`: a level sets every attribute's range, easier ones included), over `args`."""
    rg = _reasoning_gym()
    if name not in rg.factory.DATASETS:
        raise unknown_id("reasoning-gym dataset", name, rg.factory.DATASETS)
    if not rg.factory.has_curriculum(name):
        with_one = sorted(n for n in rg.factory.DATASETS if rg.factory.has_curriculum(n))
        raise TaskReaderError(f"env.reasoning_gym.curriculum_levels={levels}: reasoning-gym's {name} has no "
                              f"curriculum; set it to 0, or use a dataset that has one ({len(with_one)}: "
                              f"{', '.join(with_one)})")
    curriculum = rg.factory.create_curriculum(name)
    top = max(len(attr.levels) for attr in curriculum.attributes.values())
    if levels > top:
        raise TaskReaderError(f"env.reasoning_gym.curriculum_levels={levels}: {name}'s curriculum has {top} levels")
    out = []
    for level in range(levels):
        curriculum.set_global_level(level)
        config = dataclasses.asdict(curriculum.generate_configuration(dict(args)))
        out.append({k: v for k, v in config.items() if k not in ("seed", "size")})
    return out


def make_tasks(cfg: EnvConfig, splits: list[Split]) -> list[list[WorkflowTask]]:
    """Each split's items as tasks. A val or test item whose question is also a train question is
    left out (logged): a held-out split holds no question trained on. With curriculum levels, a
    split's tasks come evenly from each level's dataset (level L: the seeds after level L-1's)."""
    levels = cfg.reasoning_gym.curriculum_levels
    configs = level_args(cfg.id, cfg.args, levels) if levels else [cfg.args]
    prompt = system_prompt(cfg.reasoning_gym.system_prompt)
    out: list[list[WorkflowTask]] = []
    train_questions: set[str] = set()
    for split in splits:
        if split.size * len(configs) >= SPLIT_SEED_STRIDE:
            raise TaskReaderError(f"env.{split.name}_size={split.size} x {len(configs)} curriculum levels reaches the "
                                  f"next split's seeds ({SPLIT_SEED_STRIDE} apart): use fewer tasks or levels")
        tasks: list[WorkflowTask] = []
        for level, args in enumerate(configs):
            size = split.size // len(configs) + (level < split.size % len(configs))
            if size == 0:
                continue
            seed = split.seed + level * split.size  # reasoning-gym's item k is made from seed + k
            dataset = _dataset(cfg.id, json.dumps(args, sort_keys=True), seed, size)
            for index in range(size):
                spec = ReasoningGymTask(id=cfg.id, args=args, seed=seed, size=size, index=index,
                                        answer_tag=cfg.reasoning_gym.answer_tag,
                                        score_untagged_reply=cfg.reasoning_gym.score_untagged_reply)
                task_id = f"{cfg.id}-{split.name}-{len(tasks)}"
                tasks.append(_task(task_id, dataset[index], spec, prompt, level if levels else None))
        if split.name == "train":
            train_questions = {t.main_query for t in tasks}
        else:
            tasks = drop_train_questions(cfg.id, split, tasks, train_questions)
        out.append(tasks)
    return out


def _task(task_id: str, item: dict[str, Any], spec: ReasoningGymTask, prompt: str,
          level: int | None) -> WorkflowTask:
    numbers = {k: v for k, v in item.get("metadata", {}).items()
               if isinstance(v, int | float) and not isinstance(v, bool) and k != "source_index"}
    if level is not None:
        numbers["curriculum_level"] = level
    return WorkflowTask(
        task_id=task_id,
        main_query=item["question"],
        init_messages=[{"role": "system", "content": prompt}, {"role": "user", "content": item["question"]}],
        metadata={**numbers, "answer": item["answer"], "env": spec.model_dump()},
        env_type="reasoning_gym",
    )


class EnvWorkflow(Workflow):
    """One call: the task's messages in, the reply's answer scored by the dataset's score_answer."""

    name: str = "reasoning_gym"

    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        spec = ReasoningGymTask.model_validate(task.metadata["env"])
        dataset = _dataset(spec.id, json.dumps(spec.args, sort_keys=True), spec.seed, spec.size)
        item = dataset[spec.index]
        if item["question"] != task.main_query:
            raise EnvError(f"reasoning-gym's {spec.id} item {spec.index} (seed {spec.seed}) is not the task's "
                           "question: another reasoning-gym version made the tasks?")
        reply = reply_text(await tuner(list(task.init_messages)))
        answer = _reasoning_gym().utils.extract_answer(reply, tag_name=spec.answer_tag)
        tagged = answer is not None
        if not tagged and spec.score_untagged_reply:
            answer = reply.strip()
        try:
            score = dataset.score_answer(answer, item)
        except Exception as exc:  # noqa: BLE001 - the dataset's scorer: any failure is the episode's
            raise EnvError(f"reasoning-gym's {spec.id}.score_answer raised {type(exc).__name__}: {exc}") from exc
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise EnvError(f"reasoning-gym's {spec.id}.score_answer returned {score!r}, not a finite number")
        return WorkflowOutput(
            reward=float(score),
            is_success=score >= 1.0,
            metadata={"final_answer": answer, "answer": item["answer"]},
            log_metrics={"score": float(score), "answer_tagged": float(tagged)},
        )
