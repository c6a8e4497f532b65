"""Running model-written code safely: `Sandbox` (bubblewrap + a warm fork server), `SandboxPool`
(warm sandboxes handed to episodes), the env service that serves them to other machines.
docs/sandbox.md says what is isolated and how to scale it out."""

from ajet.sandbox.box import Isolation, Limits, RunResult, Sandbox, probe

__all__ = ["Isolation", "Limits", "RunResult", "Sandbox", "probe"]
