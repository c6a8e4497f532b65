"""Running model-written code safely: `Sandbox` (bubblewrap + a warm fork server), `SandboxPool`
(warm sandboxes handed to episodes), `shared_pool()` (the run's, from the config's `sandbox`
section) and the env service that serves sandboxes to other machines (`ajet.sandbox.service`).
docs/sandbox.md says what is isolated and how to scale it out."""

from ajet.sandbox.box import Isolation, Limits, RunResult, Sandbox, probe
from ajet.sandbox.pool import SandboxPool, SandboxSession
from ajet.sandbox.shared import shared_pool

__all__ = ["Isolation", "Limits", "RunResult", "Sandbox", "SandboxPool", "SandboxSession", "probe", "shared_pool"]
