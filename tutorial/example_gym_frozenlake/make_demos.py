"""Regenerate demos.jsonl: demonstrations for the SFT warm-up of `gym_frozenlake_warmup.yaml`,
played on maps of a seed range of their own (never val or test).

    python tutorial/example_gym_frozenlake/make_demos.py

A scripted policy reads the grid of each observation (Gymnasium's ansi render, the player's cell
in [brackets]) and answers with the first move of a shortest safe path to G, one word, through
the unchanged adapter workflow (`ajet.envs.demos`): the warm-up teaches the exact messages the
model sees during RL, as tutorial/example_frozenlake/make_demos.py does for ajet's own game.
Deterministic.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

from ajet.envs.demos import demos_for_yaml
from ajet.workflow import WorkflowTask

HERE = Path(__file__).parent
MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}


def read_grid(observation: str) -> tuple[list[str], tuple[int, int]]:
    """(the map rows, the player's cell) from the last grid in an observation."""
    grid: list[str] = []
    where = (-1, -1)
    for line in observation.splitlines():
        cells = line.strip()
        if not cells or set(cells.replace("[", "").replace("]", "")) - set("SFHG"):
            continue
        if "[" in cells:
            where = (len(grid), cells.index("["))
        grid.append(cells.replace("[", "").replace("]", ""))
    return grid, where


def shortest_move(grid: list[str], start: tuple[int, int]) -> str:
    """The first move of a shortest path from `start` to G that steps on no hole."""
    first: dict[tuple[int, int], str | None] = {start: None}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if grid[r][c] == "G":
            move = first[(r, c)]
            if move is None:
                raise ValueError("already at the goal")
            return move
        for name, (dr, dc) in MOVES.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < len(grid) and 0 <= nc < len(grid[0]) and grid[nr][nc] != "H" and (nr, nc) not in first:
                first[(nr, nc)] = first[(r, c)] or name
                queue.append((nr, nc))
    raise ValueError(f"no safe path from {start} on {grid}")


def policy(messages: list[dict[str, Any]], task: WorkflowTask) -> str:
    return shortest_move(*read_grid(messages[-1]["content"]))


def main(out_dir: Path = HERE, count: int = 256) -> Path:
    out = out_dir / "demos.jsonl"
    written, played = demos_for_yaml(HERE / "gym_frozenlake_warmup.yaml", policy, out, count)
    print(f"{out}: {written} demonstrations of {played} maps")
    return out


if __name__ == "__main__":
    main()
