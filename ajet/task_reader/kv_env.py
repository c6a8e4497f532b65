"""A small deterministic environment for the reference env server: key-value store tasks.

The agent sees an instruction ("Copy the value of `secret` into `backup`. Delete `tmp`.")
and the names of the keys in a store (not their values). It acts with one JSON action per
step, and ends with `done`; the episode is scored against the goal store:

    {"action": "get", "key": "secret"}          -> "secret = 42"
    {"action": "set", "key": "backup", "value": "42"}
    {"action": "delete", "key": "tmp"}
    {"action": "list"}                          -> the keys present
    {"action": "done"}                          -> ends the episode

Tasks are generated from `random.Random(f"kv-{split}-{index}")`, so every server (and every
test) sees the same tasks. Pure Python; the FastAPI app in `env_server.py` wraps it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

_KEYS = ["color", "count", "secret", "backup", "city", "tmp", "owner", "limit", "mode", "note"]
_WORDS = ["blue", "red", "green", "paris", "oslo", "lima", "alice", "bob", "fast", "slow"]
ACTIONS_HELP = (
    'Act with one JSON object per step: {"action": "get", "key": K} | '
    '{"action": "set", "key": K, "value": V} | {"action": "delete", "key": K} | '
    '{"action": "list"} | {"action": "done"} (when the store is in the goal state).'
)


@dataclass
class KVTask:
    task_id: str
    instruction: str
    initial: dict[str, str]
    goal: dict[str, str]
    max_steps: int


@dataclass
class KVEpisode:
    task: KVTask
    store: dict[str, str] = field(default_factory=dict)
    steps: int = 0
    done: bool = False


def make_task(split: str, index: int) -> KVTask:
    """The `index`-th task of `split`, the same on every call."""
    rng = random.Random(f"kv-{split}-{index}")
    keys = rng.sample(_KEYS, 6)
    initial = {k: (str(rng.randint(1, 99)) if k in ("count", "limit", "secret") else rng.choice(_WORDS))
               for k in keys[:4]}
    goal = dict(initial)
    steps: list[str] = []
    free = keys[4:]  # keys absent from the store at the start
    for op in rng.sample(["set", "copy", "delete", "increment"], rng.randint(1, 3)):
        present = sorted(goal)
        if op == "set":
            key, value = rng.choice(present + free), rng.choice(_WORDS)
            goal[key] = value
            steps.append(f"Set `{key}` to `{value}`.")
        elif op == "copy" and free:
            src, dst = rng.choice(present), free.pop()
            goal[dst] = goal[src]
            steps.append(f"Copy the value of `{src}` into `{dst}`.")
        elif op == "delete" and len(present) > 1:
            key = rng.choice(present)
            del goal[key]
            steps.append(f"Delete `{key}`.")
        elif op == "increment":
            numeric = [k for k in present if goal[k].isdigit()]
            if numeric:
                key, by = rng.choice(numeric), rng.randint(2, 9)
                goal[key] = str(int(goal[key]) + by)
                steps.append(f"Increase the number stored in `{key}` by {by}.")
    if not steps or goal == initial:  # make sure there is something to do
        key = free[0] if free else keys[0]
        goal[key] = "done"
        steps.append(f"Set `{key}` to `done`.")
    return KVTask(f"kv-{split}-{index:03d}", " ".join(steps), initial, goal, 2 * len(steps) + 6)


def parse_action(action: Any) -> dict:
    """An action as a dict; a string (an LLM's reply) may wrap the JSON object in text."""
    if isinstance(action, dict):
        return action
    if not isinstance(action, str):
        raise ValueError(f"an action must be a JSON object or a string, got {type(action).__name__}")
    try:
        parsed = json.loads(action)
    except json.JSONDecodeError:
        match = re.search(r"\{.*?\}", action, re.DOTALL)
        if match is None:
            raise ValueError("no JSON object found in the action") from None
        try:
            parsed = json.loads(match.group(0))
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON action: {exc.msg}") from None
    if not isinstance(parsed, dict):
        raise ValueError("an action must be a JSON object")
    return parsed


def store_state(store: dict[str, str]) -> str:
    """The environment's state as a short key: the store's contents (the same for two episodes
    of a task whose actions left the same keys and values). A workflow can mark its steps with
    it (`WorkflowOutput.step_states`, docs/credit.md)."""
    digest = hashlib.sha256(json.dumps(sorted(store.items())).encode()).hexdigest()
    return digest[:16]


class KVStoreEnv:
    """`num_train` + `num_val` + `num_test` tasks (each split's from its own seeds, so no task
    is in two splits); episodes are plain objects the server keeps by id."""

    env_type = "kv_store"

    def __init__(self, num_train: int = 32, num_val: int = 8, num_test: int = 16) -> None:
        self._tasks = {
            t.task_id: t
            for split, n in (("train", num_train), ("val", num_val), ("test", num_test))
            for t in (make_task(split, i) for i in range(n))
        }

    def list_tasks(self, split: str) -> list[str]:
        return [tid for tid in self._tasks if tid.startswith(f"kv-{split}-")]

    def create(self, task_id: str) -> tuple[KVEpisode, str, dict]:
        if task_id not in self._tasks:
            raise KeyError(f"unknown task_id '{task_id}'")
        task = self._tasks[task_id]
        episode = KVEpisode(task=task, store=dict(task.initial))
        observation = (
            f"Goal: {task.instruction}\nThe store holds the keys: {', '.join(sorted(episode.store))}.\n"
            f"{ACTIONS_HELP} You have {task.max_steps} steps."
        )
        return episode, observation, {"max_steps": task.max_steps, "keys": sorted(episode.store),
                                      "state": store_state(episode.store)}

    def step(self, episode: KVEpisode, action: Any) -> tuple[str, float, bool, dict]:
        """Apply one action; return (observation, reward, done, info)."""
        if episode.done:
            raise ValueError("the episode is finished; create a new instance")
        episode.steps += 1
        info: dict = {"steps": episode.steps}
        try:
            observation = self._apply(episode, parse_action(action))
        except ValueError as exc:
            observation, info["error"] = f"error: {exc}. {ACTIONS_HELP}", str(exc)
        info["state"] = store_state(episode.store)
        if not episode.done and episode.steps >= episode.task.max_steps:
            episode.done = True
            observation += " (out of steps)"
        reward = self.evaluate(episode)["reward"] if episode.done else 0.0
        return observation, reward, episode.done, info

    def evaluate(self, episode: KVEpisode) -> dict:
        """Reward = fraction of keys in their goal state (absent counts as a state)."""
        goal, store = episode.task.goal, episode.store
        keys = set(goal) | set(store) | set(episode.task.initial)
        correct = sum(store.get(k) == goal.get(k) for k in keys)
        return {
            "reward": correct / len(keys),
            "is_success": correct == len(keys),
            "steps": episode.steps,
            "done": episode.done,
        }

    def _apply(self, episode: KVEpisode, action: dict) -> str:
        name, store = action.get("action"), episode.store
        if name == "get":
            key = _key(name, action)
            return f"{key} = {store[key]}" if key in store else f"{key} is not in the store"
        if name == "set":
            key = _key(name, action)
            if "value" not in action:
                raise ValueError("'set' needs a 'value'")
            store[key] = str(action["value"])
            return f"ok: {key} = {store[key]}"
        if name == "delete":
            key = _key(name, action)
            return f"ok: deleted {key}" if store.pop(key, None) is not None else f"{key} was not there"
        if name == "list":
            return f"keys: {', '.join(sorted(store)) or '(none)'}"
        if name == "done":
            episode.done = True
            return "episode finished"
        raise ValueError(f"unknown action {name!r}")


def _key(name: str, action: dict) -> str:
    """The action's 'key'; get, set and delete refuse an action without a string one."""
    key = action.get("key")
    if not isinstance(key, str):
        raise ValueError(f"'{name}' needs a string 'key'")
    return key
