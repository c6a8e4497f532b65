"""The same math agent in Python, on `ajet.client.EpisodeClient` and the OpenAI SDK.

    AJET_URL=http://127.0.0.1:8765 AJET_TOKEN=secret python tutorial/example_remote_agent/agent.py

It may run in any process or on any machine that reaches the server: it imports nothing of ajet
but the small httpx client. Optional: AJET_MAX_EPISODES, AJET_LOG (one JSON line per reply).
"""

from __future__ import annotations

import json
import os
import sys

import openai

from ajet.client import EpisodeClient

SYSTEM_PROMPT = (
    "You solve arithmetic word problems. Give the final answer as a number in \\boxed{}, e.g. \\boxed{42}."
)


def solve(episode) -> str:  # noqa: ANN001 - an ajet.client.Episode
    # max_retries=0: a retried request whose first attempt already ran would be recorded twice.
    with openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0) as llm:
        reply = llm.chat.completions.create(model=episode.model, messages=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": episode.task["main_query"]},
        ])
    return reply.choices[0].message.content or ""


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
