"""A small FrozenLake: walk from S to G on a grid without falling into a hole (pure Python).

    S F F F      S start, F frozen (safe), H hole (the episode ends, reward 0),
    F H F H      G goal (the episode ends, reward 1).
    F F F H      Moves: left, down, right, up. A move into the edge leaves the player
    H F F G      in place; so does a reply with no move in it (counted as invalid).

Maps come from `generate_map(size, seed)`: the same seed gives the same map, and every map
has a safe path from S to G. Not slippery: moves are deterministic. A task is one map as a row
of a split (`map_task`), sized by its place in the split (`map_size`): make_data.py's splits and
make_demos.py's own maps are drawn the same way.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass, field

MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
_MOVE_WORD = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)


def has_path(rows: list[str]) -> bool:
    """Is G reachable from S through safe cells?"""
    size = len(rows)
    start = next((r, c) for r in range(size) for c in range(size) if rows[r][c] == "S")
    return rows[start[0]][start[1]] == "G" or bool(shortest_moves(rows, start))


def shortest_moves(rows: list[str], start: tuple[int, int]) -> list[str]:
    """The moves of a shortest safe path from `start` to G (breadth first, moves tried in
    MOVES order, so the same map gives the same path); [] when G is unreachable."""
    size = len(rows)
    came: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if rows[r][c] == "G":
            moves: list[str] = []
            node: tuple[int, int] = (r, c)
            while came[node] is not None:
                node, move = came[node]  # type: ignore[misc]
                moves.append(move)
            return moves[::-1]
        for move, (dr, dc) in MOVES.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size and (nr, nc) not in came and rows[nr][nc] != "H":
                came[(nr, nc)] = ((r, c), move)
                queue.append((nr, nc))
    return []


def generate_map(size: int, seed: int, hole_prob: float = 0.2) -> list[str]:
    """A size x size map with S top-left and G bottom-right, and a safe path between them."""
    if size < 2:
        raise ValueError(f"size must be >= 2, got {size}")
    rng = random.Random(f"frozenlake-{size}-{seed}")
    while True:
        cells = [["H" if rng.random() < hole_prob else "F" for _ in range(size)] for _ in range(size)]
        cells[0][0], cells[-1][-1] = "S", "G"
        rows = ["".join(row) for row in cells]
        if has_path(rows):
            return rows


QUERY = "Reach the goal G from the start S."


def map_size(i: int) -> int:
    """The size of a split's i-th map: mostly 4x4, every 4th map 5x5."""
    return 4 if i % 4 else 5


def map_task(task_id: str, grid: list[str]) -> dict:
    """The task row of a map."""
    # max_steps: enough for the shortest path (2 * (size - 1) moves) plus a few mistakes.
    return {"task_id": task_id, "question": QUERY, "map": grid, "max_steps": 2 * (len(grid) - 1) + 2}


def parse_move(text: str) -> str | None:
    """The last move word in a reply ("... so I go right" -> "right"), or None."""
    found = _MOVE_WORD.findall(text)
    return found[-1].lower() if found else None


@dataclass
class StepResult:
    observation: str
    reward: float
    done: bool
    valid: bool  # the reply named a move


@dataclass
class FrozenLake:
    rows: list[str]
    max_steps: int
    position: tuple[int, int] = (0, 0)
    steps: int = 0
    invalid_moves: int = 0
    done: bool = False
    reached_goal: bool = False
    trail: list[str] = field(default_factory=list)  # the moves made

    def __post_init__(self) -> None:
        size = len(self.rows)
        if size < 2 or any(len(row) != size for row in self.rows):
            raise ValueError(f"a map must be a square of rows, got {self.rows}")
        self.position = next((r, c) for r in range(size) for c in range(size) if self.rows[r][c] == "S")

    def render(self) -> str:
        """The grid with the player as P, one row per line, cells separated by spaces."""
        lines = []
        for r, row in enumerate(self.rows):
            cells = ["P" if (r, c) == self.position else cell for c, cell in enumerate(row)]
            lines.append(" ".join(cells))
        return "\n".join(lines)

    def safe_moves(self) -> list[str]:
        """The moves from here that stay on the lake and miss every hole, in MOVES order: the
        admissible actions an observation may list (as ALFWorld lists its commands)."""
        size, (r, c) = len(self.rows), self.position
        return [move for move, (dr, dc) in MOVES.items()
                if 0 <= r + dr < size and 0 <= c + dc < size and self.rows[r + dr][c + dc] != "H"]

    def step(self, reply: str) -> StepResult:
        """Apply the move named in `reply`; an unparseable reply wastes the step."""
        if self.done:
            raise ValueError("the episode is over; create a new FrozenLake")
        self.steps += 1
        move = parse_move(reply)
        if move is None:
            self.invalid_moves += 1
            note = "No move found in your reply; you stay where you are."
        else:
            self.trail.append(move)
            dr, dc = MOVES[move]
            r, c = self.position[0] + dr, self.position[1] + dc
            size = len(self.rows)
            if 0 <= r < size and 0 <= c < size:
                self.position = (r, c)
                note = f"You moved {move}."
            else:
                note = f"You cannot move {move} (edge of the lake); you stay where you are."
        cell = self.rows[self.position[0]][self.position[1]]
        reward = 0.0
        if cell == "H":
            self.done, note = True, note + " You fell into a hole. Game over."
        elif cell == "G":
            self.done, self.reached_goal, reward = True, True, 1.0
            note += " You reached the goal!"
        elif self.steps >= self.max_steps:
            self.done, note = True, note + " Out of steps. Game over."
        return StepResult(f"{note}\n{self.render()}", reward, self.done, move is not None)
