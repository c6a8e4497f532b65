"""`ajet tinker`: the debug backbone's engine and trainer served as a Tinker-compatible API, so
a script written for the Tinker SDK (and tinker-cookbook) trains on a laptop (docs/tinker.md).
One module a part:

- `routes`: the REST routes the pinned SDK calls (JSON, behind the API key and body caps);
- `wire`: the protobuf half of the wire (forward_backward in, its output and samples out);
- `service`: what each route does: sessions, training models, samplers, checkpoints, futures;
- `trainer`: one LoRA adapter and one AdamW per training client on one shared model;
- `losses`: the SDK's built-in losses on ajet's (`ajet.algorithms.losses`);
- `sampler`: a Tinker sample request on the local engine;
- `futures`: request ids, long-polled results, failures a client always gets;
- `checkpoints`: runs and checkpoints on disk, kept across restarts;
- `server`: the process: model, engine, trainer, HTTP server.

Nothing is imported here: the SDK (`pip install 'ajet[tinker]'`) and torch load only when the
service starts.
"""
