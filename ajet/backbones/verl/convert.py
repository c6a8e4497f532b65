"""Our merged samples -> verl's data (pure, no verl import).

verl splits each sequence into a prompt (left-padded to `max_prompt_length`) and a
response (right-padded to `max_response_length`); only response tokens can be trained.
The split point is the first trained token: everything before it is the prompt, and the
rest (assistant turns, tool outputs, later user turns) is the response, with
`response_mask` = our loss mask (tool outputs and untrained roles 0). The episode reward
sits on the last response token of `token_level_scores` (verl's `rm_scores` convention).

`sample_to_agent_loop_fields`: one unpadded sample, the fields of verl's `AgentLoopOutput`
(what our agent loop returns; verl pads it and builds its `DataProto`); `episode_outputs`: what
the agent loop returns for one episode (nothing for a failed one: it leaves its GRPO group).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ajet.backbones.gpu_worker import first_trained
from ajet.backbones.verl.translation import AGENT_NAME
from ajet.context.types import Sample
from ajet.workflow import WorkflowTask


class SampleTooLongError(ValueError):
    """A sample's prompt or response does not fit verl's padded lengths."""


def split_sample(sample: Sample) -> int:
    """The prompt length: index of the first trained token (pure)."""
    start = first_trained(sample)
    if start <= 0:
        raise ValueError(f"sample of episode {sample.episode_id!r} has no trained token after a prompt")
    return start


def sample_to_agent_loop_fields(sample: Sample, *, max_prompt_length: int, max_response_length: int
                                ) -> dict[str, Any]:
    """`AgentLoopOutput` fields (lists) for one sample; raises SampleTooLongError when it
    does not fit (the context budget should have cut it: context.max_sample_tokens)."""
    start = split_sample(sample)
    prompt, response = sample.input_ids[:start], sample.input_ids[start:]
    if len(prompt) > max_prompt_length or len(response) > max_response_length:
        raise SampleTooLongError(
            f"sample of episode {sample.episode_id!r}: prompt {len(prompt)} / response "
            f"{len(response)} tokens exceed verl's data.max_prompt_length={max_prompt_length} / "
            f"data.max_response_length={max_response_length}; lower context.max_sample_tokens"
        )
    return {
        "prompt_ids": list(prompt),
        "response_ids": list(response),
        "response_mask": [int(bool(m)) for m in sample.loss_mask[start:]],
        "response_logprobs": [float(x) for x in sample.old_logprobs[start:]],
        "reward_score": float(sample.reward),
        "num_turns": 2 * sample.num_calls,
    }


def pick_episode_sample(samples: list[Sample]) -> tuple[Sample | None, int]:
    """verl takes one sequence per episode: the sample with the most trained tokens.

    Returns it (None when no sample trains anything) and how many trained samples were left
    out (forks that did not merge; counted as a metric, never silently).
    """
    trained = [s for s in samples if any(s.loss_mask)]
    if not trained:
        return None, 0
    best = max(trained, key=lambda s: (sum(1 for m in s.loss_mask if m), -trained.index(s)))
    return best, len(trained) - 1


def episode_outputs(episode: Any, samples: list[Sample], *, max_prompt_length: int, max_response_length: int,
                    stand_in_prompt: Callable[[], list[int]], eos_token_id: int) -> list[dict[str, Any]]:
    """What the agent loop returns for one episode, as `AgentLoopOutput` fields (pure).

    - A failed episode: nothing. verl's (v1) trainer forms each GRPO group from the outputs
      its prompt's sessions returned (keys `{uid}_{session}_{index}`, grouped by uid); a
      session that returned none is not in its group, so the failed episode stays out of the
      group's mean and std, as on the debug backbone, which trains on ok episodes only. (A
      reward-0 stand-in would count as a zero reward in both.)
    - An ok episode: its sample with the most trained tokens (`pick_episode_sample`).
    - An ok episode without a trained token (only untrained roles called, or the budget cut
      every sample): an untrained stand-in, the chat prompt (`stand_in_prompt()`) and one eos
      with mask 0, carrying the episode's reward: it counts in its group, as on debug, and
      trains nothing.
    Each carries `extra_fields` for verl's logs: `ajet_samples_left_out`, `ajet_stand_in`.
    """
    if not episode.ok:
        return []
    sample, left_out = pick_episode_sample(samples)
    if sample is None:
        fields = {"prompt_ids": list(stand_in_prompt())[-max_prompt_length:], "response_ids": [eos_token_id],
                  "response_mask": [0], "response_logprobs": [0.0], "reward_score": float(episode.reward),
                  "num_turns": 0}
    else:
        fields = sample_to_agent_loop_fields(sample, max_prompt_length=max_prompt_length,
                                             max_response_length=max_response_length)
    fields["extra_fields"] = {"ajet_samples_left_out": left_out, "ajet_stand_in": int(sample is None)}
    return [fields]


# ---------------------------------------------------------------------- tasks -> verl's dataset
def task_to_verl_row(task: WorkflowTask, *, index: int, split: str, config_path: str) -> dict[str, Any]:
    """One row of the parquet verl's RLHFDataset reads (pure).

    `prompt` (chat messages) is what verl tokenizes and shows; the agent loop rebuilds the
    full task from `extra_info.ajet_task` and finds the run's config at `extra_info.ajet_config`.
    """
    messages = list(task.init_messages) or [{"role": "user", "content": task.main_query}]
    return {
        "data_source": "ajet",
        "agent_name": AGENT_NAME,
        "prompt": [{"role": str(m.get("role", "user")), "content": str(m.get("content") or "")} for m in messages],
        "reward_model": {"style": "rule", "ground_truth": ""},
        "extra_info": {"index": index, "split": split, "ajet_task": task.model_dump_json(),
                       "ajet_config": config_path},
    }


def task_from_extra_info(extra_info: dict[str, Any]) -> tuple[WorkflowTask, str]:
    """(task, config path) from a row's `extra_info` (pure)."""
    try:
        return WorkflowTask.model_validate_json(extra_info["ajet_task"]), str(extra_info["ajet_config"])
    except KeyError as exc:
        raise ValueError(f"extra_info has no {exc.args[0]!r}; the dataset must be written by ajet's "
                         "verl backbone (ajet.backbones.verl.convert.task_to_verl_row)") from None


def write_parquet(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
