"""FrozenLake, multi-turn: each turn the agent sees the grid as text and answers with a move.

The conversation grows by one assistant reply and one user observation per turn, so every
call extends the previous one: the context tracker builds each prompt from the earlier
prompt + completion token ids, and the episode's N calls merge into one training sample.
Reward: 1 for reaching G, else 0 (a hole, or out of steps). Each call's state (the position
on the task's map) is marked in `step_states`, for step credit (`frozenlake_step_credit.yaml`,
docs/credit.md): the rollouts of one map all start at S, and the ones that walk the same way
meet again.

`FrozenLakeCompactingAgent` keeps its conversation under a budget: when the history is over it,
the model itself summarises it (a policy turn, trained) and the conversation starts again from
the system prompt, the task with the summary, and the grid (`frozenlake_compaction.yaml`).
"""

from __future__ import annotations

from typing import ClassVar

from frozenlake_env import FrozenLake

from ajet import Workflow, WorkflowOutput, WorkflowTask

SYSTEM_PROMPT = (
    "You walk on a frozen lake drawn as a grid: P is you, F is safe ice, H is a hole, G is the "
    "goal. Rows are listed top to bottom; 'down' moves one row down, 'right' one column right. "
    "Reach G without stepping into a hole. Each turn, answer with one move: left, down, right "
    "or up."
)


class FrozenLakeAgent(Workflow):
    name: str = "frozenlake"
    # List the safe moves under the grid each turn (FrozenLakeSafeMovesAgent).
    safe_move_hints: ClassVar[bool] = False

    def ask(self, env: FrozenLake) -> str:
        """The end of each observation: the safe moves (with hints on), then the question."""
        if self.safe_move_hints:
            return f"Safe moves: {', '.join(env.safe_moves())}.\nYour move?"
        return "Your move?"

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        env = FrozenLake(list(task.metadata["map"]), max_steps=int(task.metadata["max_steps"]))
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{task.main_query}\n{env.render()}\n{self.ask(env)}"},
        ]
        states = []  # the state each call acts in: the position (the map is the task's)
        while not env.done:
            states.append("{},{}".format(*env.position))
            response = await tuner(messages)
            reply = "".join(block["text"] for block in response.content if block["type"] == "text")
            # The reply goes back exactly as received, so the next call extends this one.
            messages.append({"role": "assistant", "content": reply})
            result = env.step(reply)
            if not result.done:
                messages.append({"role": "user", "content": f"{result.observation}\n{self.ask(env)}"})
        return WorkflowOutput(
            reward=1.0 if env.reached_goal else 0.0,
            is_success=env.reached_goal,
            step_states=states,  # algorithm.step_credit=gigpo compares the steps from one position
            metadata={"trail": env.trail},
            log_metrics={
                "turns": float(env.steps),
                "invalid_moves": float(env.invalid_moves),
                "reached_goal": float(env.reached_goal),
            },
        )


class FrozenLakeSafeMovesAgent(FrozenLakeAgent):
    """The same agent, whose observations also list the moves that neither leave the lake nor
    step into a hole ("Safe moves: down, right."), as text environments such as ALFWorld list
    their admissible commands. The map, the rules and the reward are unchanged; what is left to
    the model is choosing the safe move that leads to G within max_steps."""

    name: str = "frozenlake_safe_moves"
    safe_move_hints: ClassVar[bool] = True


COMPACT_PROMPT = "Your notes are full. In one line, say which moves you made and where you are now."


class FrozenLakeCompactingAgent(FrozenLakeAgent):
    """The grid-only agent with a context budget: before a move, when the conversation is longer
    than `history_budget_chars`, the model summarises it (a call on the same history plus
    COMPACT_PROMPT, trained like any other turn), and the history is rewritten to the system
    prompt, the task with that summary, and the current grid. The turns after a rewrite are
    their own training sample (its break is "rewrite": docs/credit.md); the episode's reward
    and advantage reach both. The grid shows where P is, so the summary loses nothing the
    task needs: the variant should learn as the uncompacted one does."""

    name: str = "frozenlake_compaction"
    history_budget_chars: int = 700  # a conversation of one-word moves is over it after ~4 moves

    async def execute(self, task: WorkflowTask, tuner) -> WorkflowOutput:  # noqa: ANN001
        env = FrozenLake(list(task.metadata["map"]), max_steps=int(task.metadata["max_steps"]))
        observation = f"{task.main_query}\n{env.render()}\n{self.ask(env)}"
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": observation}]
        states: list[str | None] = []
        compactions = 0
        while not env.done:
            if sum(len(m["content"]) for m in messages) > self.history_budget_chars:
                states.append(None)  # the summary call acts in no environment state
                summary = await tuner([*messages, {"role": "user", "content": COMPACT_PROMPT}])
                notes = "".join(b["text"] for b in summary.content if b["type"] == "text").strip()
                messages = [{"role": "system", "content": SYSTEM_PROMPT},
                            {"role": "user", "content": f"{task.main_query}\nYour notes: {notes}\n"
                                                        f"{observation}"}]
                compactions += 1
            states.append("{},{}".format(*env.position))
            response = await tuner(messages)
            reply = "".join(block["text"] for block in response.content if block["type"] == "text")
            messages.append({"role": "assistant", "content": reply})
            result = env.step(reply)
            if not result.done:
                observation = f"{result.observation}\n{self.ask(env)}"
                messages.append({"role": "user", "content": observation})
        return WorkflowOutput(
            reward=1.0 if env.reached_goal else 0.0,
            is_success=env.reached_goal,
            step_states=states,
            metadata={"trail": env.trail},
            log_metrics={
                "turns": float(env.steps),
                "invalid_moves": float(env.invalid_moves),
                "reached_goal": float(env.reached_goal),
                "compactions": float(compactions),
            },
        )
