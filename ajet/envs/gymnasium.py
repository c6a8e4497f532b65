"""Gymnasium (https://gymnasium.farama.org): an environment id with a discrete action space, played
as text. One model call per environment step, up to `env.max_turns`.

A task is one `reset(seed=...)` of the environment (`gym.make(id, **env.args)`): the split's k-th
task resets with the split's seed + k. `env.gymnasium.task_args` names a function of that seed that
gives the task's own `gym.make` arguments over `env.args` (FrozenLake's `desc`: a map per task). A
val or test task whose arguments are a train task's is left out (logged), as reasoning-gym's
questions are: a held-out split holds no map trained on. (Without `task_args` the tasks differ by
their seed alone, and none is left out.) Each turn the model sees the observation as text (the
env's ansi render with its coloured cells in [brackets], the observation itself when the env has
no ansi render, or `env.gymnasium.renderer`'s text) and answers with an action by its name; the
names are `env.gymnasium.actions`, else the environment's docstring ("- 0: Move left"), else the
numbers. A reply that names no action is an invalid move: counted, nothing happens, the turn is
spent (as ajet's own FrozenLake does).

The reward is the sum of the environment's rewards; each call's reward is its step's
(`step_rewards`) and its state the observation it acted on (`step_states`, GiGPO's step credit).
An environment that raises, or returns a malformed observation or reward, fails the episode
(`EnvError`), never the run.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from ajet.config.schema import EnvConfig
from ajet.envs.base import (
    EnvError,
    Split,
    drop_train_questions,
    import_optional,
    load_function,
    reply_text,
    unknown_id,
)
from ajet.errors import TaskReaderError
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask

# "- 0: Move left" in the "## Action Space" section of a Gymnasium environment's docstring.
_ACTION_SECTION = re.compile(r"## Action Space(.*?)(?:\n\s*## |\Z)", re.S)
_ACTION_LINE = re.compile(r"^\s*-\s*(\d+):\s*(.+?)\s*$", re.M)
_ANSI_SPAN = re.compile(r"\x1b\[[0-9;]*m([^\x1b]*)\x1b\[0m")
_ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")


class GymnasiumTask(BaseModel):
    """`task.metadata["env"]`: what rebuilds the task's environment and plays it."""

    model_config = ConfigDict(extra="forbid")

    id: str
    args: dict[str, Any]
    seed: int
    max_turns: int
    actions: list[str]
    render_mode: str | None
    renderer: str
    system_prompt: str


def _gymnasium() -> Any:
    # Only where a Gymnasium env is used (ajet's other runs never import it).
    return import_optional("gymnasium", "gymnasium")


def make_env(env_id: str, args: dict[str, Any], render_mode: str | None) -> Any:
    """`gym.make(env_id, render_mode=..., **args)`, or a `TaskReaderError` that says what is wrong."""
    gym = _gymnasium()
    if env_id not in gym.envs.registry:
        raise unknown_id("Gymnasium environment", env_id, gym.envs.registry)
    try:
        return gym.make(env_id, **args, **({"render_mode": render_mode} if render_mode else {}))
    except (TypeError, ValueError, ImportError, gym.error.Error) as exc:
        raise TaskReaderError(f"env.id={env_id} with env.args={args}: gym.make raised {type(exc).__name__}: "
                              f"{exc}") from None


def action_names(env: Any, configured: list[str]) -> list[str]:
    """The actions' names, in the action space's order (see the module's docstring)."""
    space = env.action_space
    if type(space).__name__ != "Discrete":
        raise TaskReaderError(f"{env.spec.id}'s action space is {space}: only Discrete action spaces are "
                              "supported (a reply names one of n actions)")
    n = int(space.n)
    if configured:
        if len(configured) != n:
            raise TaskReaderError(f"env.gymnasium.actions names {len(configured)} actions; {env.spec.id} has {n}")
        return list(configured)
    section = _ACTION_SECTION.search(type(env.unwrapped).__doc__ or "")
    found = {int(i): text for i, text in _ACTION_LINE.findall(section.group(1))} if section else {}
    return [found[i] for i in range(n)] if set(found) == set(range(n)) else [str(i) for i in range(n)]


def parse_action(reply: str, names: list[str]) -> int | None:
    """The index of the action the reply names last: by its whole name, or by a word of its name
    that no other name has ("left" for "Move left"); case does not matter. None: no action."""
    words = [re.findall(r"[a-z0-9]+", name.lower()) for name in names]
    counts = Counter(w for ws in words for w in set(ws))
    aliases = {name.lower(): i for i, name in enumerate(names)}
    for i, ws in enumerate(words):
        for w in ws:
            if counts[w] == 1 and len(w) >= 2:
                aliases.setdefault(w, i)
    text, best, best_end = reply.lower(), None, -1
    for alias, i in aliases.items():
        for match in re.finditer(rf"(?<![a-z0-9]){re.escape(alias)}(?![a-z0-9])", text):
            if match.end() > best_end:
                best, best_end = i, match.end()
    return best


def _plain(value: Any) -> Any:
    """An observation as plain Python (NumPy arrays and scalars as lists and numbers)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def observation_text(env: Any, observation: Any, renderer: Callable[..., Any] | None) -> str:
    """What the model sees of `observation`."""
    if renderer is not None:
        text = renderer(observation, env)
        if not isinstance(text, str):
            raise EnvError(f"env.gymnasium.renderer returned {type(text).__name__}, not str")
        return text
    if env.render_mode == "ansi":
        rendered = env.render()
        if not isinstance(rendered, str):
            raise EnvError(f"{env.spec.id}.render() returned {type(rendered).__name__}, not the ansi text")
        return _ANSI_CODE.sub("", _ANSI_SPAN.sub(r"[\1]", rendered)).strip("\n")
    return f"Observation: {json.dumps(_plain(observation))}"


@functools.lru_cache(maxsize=8)
def _renderer(target: str) -> Callable[..., Any] | None:
    return load_function(target, "env.gymnasium.renderer") if target else None


def default_prompt(env_id: str, names: list[str]) -> str:
    return (f"You act in the environment {env_id}. Each turn you see its state and answer with one "
            f"action, by its name: {', '.join(names)}.")


def make_tasks(cfg: EnvConfig, splits: list[Split]) -> list[list[WorkflowTask]]:
    """Each split's resets as tasks; the question is the first observation's text."""
    probe = make_env(cfg.id, cfg.args, None)
    render_mode = "ansi" if "ansi" in probe.metadata.get("render_modes", []) else None
    names = action_names(probe, cfg.gymnasium.actions)
    probe.close()
    renderer = _renderer(cfg.gymnasium.renderer)
    per_task = load_function(cfg.gymnasium.task_args, "env.gymnasium.task_args") if cfg.gymnasium.task_args else None
    env = make_env(cfg.id, cfg.args, render_mode)
    out: list[list[WorkflowTask]] = []
    train_layouts: set[str] = set()
    try:
        for split in splits:
            tasks = []
            for k in range(split.size):
                seed = split.seed + k
                args = cfg.args if per_task is None else {**cfg.args, **_task_args(per_task, cfg.gymnasium.task_args, seed)}
                spec = GymnasiumTask(id=cfg.id, args=args, seed=seed, max_turns=cfg.max_turns,
                                     actions=names, render_mode=render_mode, renderer=cfg.gymnasium.renderer,
                                     system_prompt=cfg.gymnasium.system_prompt or default_prompt(cfg.id, names))
                if per_task is not None:  # the task's own environment (its map, ...)
                    env.close()
                    env = make_env(cfg.id, args, render_mode)
                observation = _reset(env, spec.seed)
                tasks.append(WorkflowTask(task_id=f"{cfg.id}-{split.name}-{k}",
                                          main_query=observation_text(env, observation, renderer),
                                          metadata={"env": spec.model_dump()}, env_type="gymnasium"))
            if per_task is not None:  # a task is its task_args (its map): a held-out one is no train one
                if split.name == "train":
                    train_layouts = {_layout(t) for t in tasks}
                else:
                    tasks = drop_train_questions(cfg.id, split, tasks, train_layouts, key=_layout)
            out.append(tasks)
    except EnvError as exc:
        raise TaskReaderError(f"env.id={cfg.id}: {exc}") from None
    finally:
        env.close()
    return out


def _layout(task: WorkflowTask) -> str:
    return json.dumps(task.metadata["env"]["args"], sort_keys=True)


def _task_args(function: Callable[..., Any], target: str, seed: int) -> dict[str, Any]:
    """`env.gymnasium.task_args`'s keyword arguments for the task with `seed`, checked: a dict with
    string keys that survives JSON (the task's metadata carries it to wherever the episode runs)."""
    try:
        args = function(seed)
    except Exception as exc:  # noqa: BLE001 - the user's function: say where it failed
        raise TaskReaderError(f"env.gymnasium.task_args={target} raised {type(exc).__name__} for seed {seed}: "
                              f"{exc}") from exc
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise TaskReaderError(f"env.gymnasium.task_args={target} returned {args!r:.200} for seed {seed}: "
                              "it must return a dict of gym.make's keyword arguments")
    plain = _plain(args)
    try:
        if json.loads(json.dumps(plain)) != plain:
            raise ValueError("it changes through JSON")
    except (TypeError, ValueError) as exc:
        raise TaskReaderError(f"env.gymnasium.task_args={target} returned {args!r:.200} for seed {seed}, which "
                              f"the task's metadata cannot hold ({exc}): return lists, numbers and strings") from None
    return plain


def _reset(env: Any, seed: int) -> Any:
    try:
        observation, _info = env.reset(seed=seed)
    except Exception as exc:  # noqa: BLE001 - the environment's code: any failure is the episode's
        raise EnvError(f"{env.spec.id}.reset(seed={seed}) raised {type(exc).__name__}: {exc}") from exc
    _check_observation(env, observation, f"reset(seed={seed})")
    return observation


def _step(env: Any, action: int) -> tuple[Any, float, bool, bool]:
    try:
        observation, reward, terminated, truncated, _info = env.step(action)
    except Exception as exc:  # noqa: BLE001 - the environment's code (a wrong tuple too): the episode's
        raise EnvError(f"{env.spec.id}.step({action}) raised {type(exc).__name__}: {exc}") from exc
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise EnvError(f"{env.spec.id}.step({action}) returned the reward {reward!r}: not a finite number")
    _check_observation(env, observation, f"step({action})")
    return observation, float(reward), bool(terminated), bool(truncated)


def _check_observation(env: Any, observation: Any, where: str) -> None:
    if not env.observation_space.contains(observation):
        raise EnvError(f"{env.spec.id}.{where} returned the observation {observation!r:.200}, which is not in "
                       f"its observation space {env.observation_space}")


class EnvWorkflow(Workflow):
    """The episode loop: observe, ask the model, parse its action, step; up to max_turns calls."""

    name: str = "gymnasium"

    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        spec = GymnasiumTask.model_validate(task.metadata["env"])
        try:
            env = make_env(spec.id, spec.args, spec.render_mode)
        except TaskReaderError as exc:
            raise EnvError(str(exc)) from exc
        try:
            return await self._play(env, spec, _renderer(spec.renderer), tuner)
        finally:
            env.close()

    async def _play(self, env: Any, spec: GymnasiumTask, renderer: Callable[..., Any] | None,
                    tuner: Any) -> WorkflowOutput:
        observation = _reset(env, spec.seed)
        start = env.action_space.start
        messages: list[dict[str, Any]] = [{"role": "system", "content": spec.system_prompt}]
        rewards: list[float] = []
        states: list[str | None] = []
        trail: list[str] = []
        note, invalid, terminated, truncated = "", 0, False, False
        for _turn in range(spec.max_turns):
            messages.append({"role": "user", "content": f"{note}{observation_text(env, observation, renderer)}\n"
                                                        "Your action?"})
            states.append(json.dumps(_plain(observation)))
            reply = reply_text(await tuner(messages))
            # The reply goes back exactly as received, so the next call extends this one (one sample).
            messages.append({"role": "assistant", "content": reply})
            action = parse_action(reply, spec.actions)
            if action is None:
                invalid += 1
                rewards.append(0.0)
                note = f"No action found in your reply (one of: {', '.join(spec.actions)}); nothing happened.\n"
                continue
            trail.append(spec.actions[action])
            observation, reward, terminated, truncated = _step(env, int(start) + action)
            rewards.append(reward)
            if terminated or truncated:
                break
            note = f"You chose {spec.actions[action]}; reward {reward:g}.\n"
        total = sum(rewards)
        return WorkflowOutput(
            reward=total,
            is_success=terminated and total > 0,
            step_rewards=rewards,
            step_states=states,
            metadata={"actions": trail},
            log_metrics={"turns": float(len(rewards)), "invalid_moves": float(invalid), "return": total,
                         "terminated": float(terminated), "truncated": float(truncated)},
        )
