"""The math agent in Python, on `ajet.serve.client.EpisodeClient` and the OpenAI SDK, with its calculator.

    AJET_URL=http://127.0.0.1:8765 AJET_TOKEN=secret python tutorial/example_remote_agent/agent.py

It may run in any process or on any machine that reaches the server: it imports nothing of ajet
but the small httpx client, and takes the math agent's prompt and calculator from their one copy
(tutorial/example_math_agent/calculator_tool.py, beside this folder). Optional:
AJET_MAX_EPISODES, AJET_LOG (one JSON line per reply).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import openai

from ajet.serve.client import EpisodeClient

# The math agent's prompt and calculator (the arithmetic, the `calculate` tool's spec, the runner
# of a call), from their one copy: tutorial/example_math_agent/calculator_tool.py, standard
# library only, loaded from its file (this client runs from any directory, on any sys.path).
_SPEC = importlib.util.spec_from_file_location(
    "remote_agent_calculator", Path(__file__).resolve().parents[1] / "example_math_agent" / "calculator_tool.py")
assert _SPEC is not None and _SPEC.loader is not None
calculator = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(calculator)

SYSTEM_PROMPT = calculator.SYSTEM_PROMPT
# With the expression's pattern: the server forces the first call (remote_agent.yaml) and decodes
# it under this schema, so the model cannot write prose there.
CALCULATE_TOOL = calculator.CALCULATE_TOOL_WITH_PATTERN
MAX_TURNS = 3  # model calls an episode: the tool call, the answer, one spare


def solve(episode) -> str:  # noqa: ANN001 - an ajet.serve.client.RemoteEpisode
    """A tool loop: the model may call `calculate`; the episode's answer is its last text reply."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": episode.task["main_query"]},
    ]
    answer = ""
    # max_retries=0: a retried request whose first attempt already ran would be recorded twice.
    with openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0) as llm:
        for _ in range(MAX_TURNS):
            message = llm.chat.completions.create(
                model=episode.model, messages=messages, tools=[CALCULATE_TOOL]).choices[0].message
            messages.append(message.model_dump(exclude_none=True))  # unchanged: the next call extends it
            answer = message.content or answer
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                result = calculator.run_tool_call(call.model_dump())
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return answer


def main() -> int:
    token = os.environ.get("AJET_TOKEN")
    if not token:
        sys.stderr.write("set AJET_TOKEN to the server's client token (printed by `ajet serve`)\n")
        return 2
    max_episodes = int(os.environ.get("AJET_MAX_EPISODES", "0")) or None
    log = os.environ.get("AJET_LOG")
    done = 0
    with EpisodeClient(os.environ.get("AJET_URL", "http://127.0.0.1:8765"), token) as client:
        while max_episodes is None or done < max_episodes:
            episode = client.begin()  # None once the run has ended
            if episode is None:
                break
            try:
                answer = solve(episode)
            except openai.OpenAIError as err:  # counted as failed, never trained on
                client.abort(episode.episode_id, f"{type(err).__name__}: {err}"[:500])
                continue
            if log:
                with open(log, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps({"episode_id": episode.episode_id, "content": answer}) + "\n")
            client.finish(episode.episode_id, metadata={"final_answer": answer})
            done += 1
    sys.stdout.write(f"python agent: {done} episodes finished\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
