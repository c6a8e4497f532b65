"""The functional form: a plain async function is the workflow.

    python tutorial/example_function_workflow/adder.py          # = ajet.tune(adder, "adder.yaml")

The agent answers one-digit additions. The reward is 1.0 when the last number of the reply
is the right sum ("8", "4 + 4 = 8"), else 0.0; a float reward of 1.0 counts as a success.
"""

from __future__ import annotations

import re
from pathlib import Path

SYSTEM_PROMPT = "You are a calculator. Reply with the result only, as digits, nothing else."


def score(reply: str, answer: str) -> float:
    numbers = re.findall(r"-?\d+", reply)
    return 1.0 if numbers and numbers[-1] == answer else 0.0


async def adder(task: dict, model) -> float:  # noqa: ANN001 - `model` is ajet's ModelTuner
    client = model.openai_client()
    reply = await client.chat.completions.create(
        model="policy",
        messages=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task["main_query"]},
        ],
    )
    return score(reply.choices[0].message.content or "", task["answer"])


if __name__ == "__main__":
    import sys

    import ajet

    ajet.tune(adder, str(Path(__file__).with_name("adder.yaml")), overrides=sys.argv[1:])
