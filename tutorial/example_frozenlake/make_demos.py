"""Regenerate demos.jsonl: demonstrations for the SFT warm-up (`frozenlake_warmup.yaml`), made
from the TRAIN maps and from maps of a seed range of their own, never from val or test.

    python tutorial/example_frozenlake/make_demos.py   # demos.jsonl and demos_safe_moves.jsonl

A scripted agent plays the model behind the unchanged `FrozenLakeAgent` workflow: each turn it
reads the grid of the last observation (where P stands) and answers with the first move of a
shortest safe path to G, one word ("down"). The dialog the workflow sent on its last turn plus
that reply is one SFT dialog (docs/pipeline.md): every reply in it is trained, so the warm-up
teaches the exact messages the agent sees during RL. A demo map that is also a val or test map
is skipped. Deterministic.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from frozenlake_env import generate_map, map_size, map_task, shortest_moves

HERE = Path(__file__).parent
DEMO_SEEDS = 30_000  # the extra demo maps' seed range (train 0.., val 10_000.., test 20_000..)


def read_grid(observation: str) -> tuple[list[str], tuple[int, int]]:
    """(the map rows with S where P stands, P's position) from an observation's grid lines."""
    lines = [line.split() for line in observation.splitlines()]
    grid = [cells for cells in lines if cells and all(c in "SFHGP" and len(c) == 1 for c in cells)]
    where = next((r, row.index("P")) for r, row in enumerate(grid) if "P" in row)
    return ["".join("S" if c == "P" else c for c in row) for row in grid], where


class ScriptedTuner:
    """Stands in for the tuner: answers each turn with the next move of a shortest path."""

    def __init__(self) -> None:
        self.calls: list[list[dict[str, Any]]] = []

    async def __call__(self, messages: list[dict[str, Any]]) -> Any:
        self.calls.append([dict(m) for m in messages])
        rows, where = read_grid(messages[-1]["content"])
        moves = shortest_moves(rows, where)
        if not moves:
            raise ValueError(f"no safe path from {where} on {rows}")
        return SimpleNamespace(content=[{"type": "text", "text": moves[0]}])


async def demo(task: dict, safe_moves: bool = False) -> dict:
    """One SFT dialog: the scripted agent walking `task`'s map through the real workflow
    (FrozenLakeSafeMovesAgent's, whose observations list the safe moves, with `safe_moves`)."""
    from frozenlake import FrozenLakeAgent, FrozenLakeSafeMovesAgent

    from ajet import WorkflowTask

    tuner = ScriptedTuner()
    agent = FrozenLakeSafeMovesAgent() if safe_moves else FrozenLakeAgent()
    output = await agent.execute(
        WorkflowTask(task_id=task["task_id"], main_query=task["question"], metadata=task), tuner)
    if not output.is_success:
        raise ValueError(f"{task['task_id']}: the scripted agent did not reach the goal ({output.metadata})")
    last = tuner.calls[-1]
    reply = output.metadata["trail"][-1]
    return {"id": f"frozenlake-{task['task_id']}", "task_type": "frozenlake",
            "messages": [*last, {"role": "assistant", "content": reply}]}


def demo_tasks(count: int) -> list[dict]:
    """The train maps, then maps from DEMO_SEEDS on (sized and made into tasks as make_data's),
    none of them a val or test map, up to `count`."""
    read = [json.loads(line) for line in (HERE / "train.jsonl").read_text().splitlines() if line.strip()]
    held_out = {"/".join(json.loads(line)["map"]) for split in ("val", "test")
                for line in (HERE / f"{split}.jsonl").read_text().splitlines() if line.strip()}
    seen = {"/".join(t["map"]) for t in read}
    tasks = [t for t in read if "/".join(t["map"]) not in held_out]
    seed = DEMO_SEEDS
    while len(tasks) < count:
        grid = generate_map(map_size(len(tasks)), seed=seed)
        seed += 1
        key = "/".join(grid)
        if key in held_out or key in seen:
            continue
        seen.add(key)
        tasks.append(map_task(f"demo-{seed - DEMO_SEEDS - 1}", grid))
    return tasks[:count]


DEMO_FILES = {False: "demos.jsonl", True: "demos_safe_moves.jsonl"}


def main(out_dir: Path = HERE, count: int = 256) -> list[Path]:
    """Both demo files: the grid-only agent's (demos.jsonl) and the safe-moves agent's
    (demos_safe_moves.jsonl), on the same maps."""
    tasks = demo_tasks(count)
    written = []
    for safe_moves, name in DEMO_FILES.items():
        rows = [asyncio.run(demo(task, safe_moves)) for task in tasks]
        out = out_dir / name
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        written.append(out)
    return written


if __name__ == "__main__":
    print(*main(), sep="\n")
