"""How a second OpenMP pool in the process slows the engine's decode (docs/log/2026-11-25_decode_openmp_and_overlap.md,
"Decode on 2 cores"): the fp16 engine decodes 16 requests x 64 tokens after

- `none`: nothing else ran torch;
- `thread`: one forward of the model ran in a thread that then ended (its pool ended with it);
- `main`: one forward ran in the main thread (its pool stays for the process's life);
- `engine`: a second engine decoded once (its pool stays while it is open).

    .venv/bin/python -m scripts.bench.thread_pools [--modes none,thread,main,engine] [--repeats 3]

Each mode runs in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from scripts.bench.common import child_env

_ONE = """
import asyncio, sys, threading, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from ajet.engine.base import SamplingParams
from ajet.engine.local import LocalEngine
from ajet.models.resolve import resolve_model_path
from scripts.bench.common import chat_prompts
mode, repeats = sys.argv[1], int(sys.argv[2])
path = resolve_model_path("smollm2-135m-instruct")
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
tokenizer = AutoTokenizer.from_pretrained(path)
prompts = chat_prompts(tokenizer, 16)
engine = LocalEngine(model, tokenizer, max_batch_size=32, eos_token_ids=[], dtype="float16")
async def run(eng, tokens):
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    return await asyncio.gather(*(eng.generate(p, params) for p in prompts))
asyncio.run(run(engine, 8))
def forward():
    with torch.no_grad():
        model(torch.tensor([prompts[0]]))
if mode == "main":
    forward()
elif mode == "thread":
    worker = threading.Thread(target=forward)
    worker.start()
    worker.join()
elif mode == "engine":
    other = LocalEngine(model, tokenizer, max_batch_size=32, eos_token_ids=[], dtype="float32")
    asyncio.run(run(other, 8))
for _ in range(repeats):
    start = time.perf_counter()
    asyncio.run(run(engine, 64))
    print(16 * 64 / (time.perf_counter() - start))
"""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="none,thread,main,engine")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'mode':<8} fp16 engine, 16 concurrent, tok/s per repeat")
    for mode in (m for m in args.modes.split(",") if m):
        out = subprocess.run([sys.executable, "-c", _ONE, mode, str(args.repeats)], capture_output=True,
                             text=True, check=True, env=child_env())
        rates = [float(line) for line in out.stdout.split()]
        print(f"{mode:<8} " + "  ".join(f"{r:6.1f}" for r in rates), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
