"""The tinker backbone: the workflow, gateway, tracker, merging, judges and records run here as
on the debug backbone; sampling and training go to a Tinker-compatible service (hosted Tinker,
`ajet tinker`, SkyRL tx) through the official SDK (docs/tinker.md). A CPU-only machine trains a
model it could not hold.

- `engine`: ajet's `InferenceEngine` over the SDK's `SamplingClient` (token ids and logprobs);
- `datums`: a step's samples as datums with weighted advantages, the built-in loss's config (pure);
- `remote`: the session, the LoRA training client, forward_backward / optim_step, saves;
- `recipe`: the RL recipe with its update on the service, checkpoints that name its saved state.
"""

from __future__ import annotations

from pathlib import Path

from ajet.algorithms.base import Problems
from ajet.algorithms.registry import backbone_algorithms, get_algorithm
from ajet.backbones.contract import Capabilities
from ajet.backbones.tinker.remote import lora_targets
from ajet.config.schema import AjetConfig, LoraConfig
from ajet.errors import UserError
from ajet.rollout.workflow_loader import WorkflowArg

# The GRPO family, whose clipped loss is the service's built-in `ppo` (AlgorithmSpec.backbone_names);
# the episodes run here with ajet's reader, judges and curriculum; one adapter, no overlap, no serve.
CAPABILITIES = Capabilities(
    algorithms=tuple(backbone_algorithms("tinker")), stages=False, overlap=False, serve=False, ray_recipes=(),
    per_role_adapters=False, group_judges=True, curriculum=True, task_selection=True, generated_tasks=False,
    cpu=True, keep_matmuls=False, section="tinker", local_model=False,
)


def check_config(cfg: AjetConfig) -> Problems:
    """What a Tinker service cannot train as asked: it trains LoRA adapters only, scores tokens at
    temperature 1 and has no KL, entropy or TIS term in its built-in losses."""
    problems: Problems = []
    lora, default = cfg.model.lora, LoraConfig()
    if not cfg.tinker.base_model:
        problems.append(("tinker.base_model", "is empty: name the service's model (tinker.ServiceClient()"
                                              ".get_server_capabilities() lists them)"))
    if not lora.enabled:
        problems.append(("model.lora.enabled", "=false asks for a full fine-tune; a Tinker service trains LoRA "
                                               "adapters only: set model.lora.enabled=true (model.lora.r is the rank)"))
    if lora_targets(lora.target_modules) is None:
        problems.append(("model.lora.target_modules", f"={lora.target_modules}: a Tinker service trains whole groups "
                                                      "of modules: all of q/k/v/o_proj (attention), all of gate/up/"
                                                      "down_proj (MLP), lm_head, or a union of these"))
    for key, value, was in (("alpha", lora.alpha, default.alpha), ("dropout", lora.dropout, default.dropout)):
        if value != was:
            problems.append((f"model.lora.{key}", "is chosen by the Tinker service, not sent: remove it"))
    if cfg.rollout.temperature != 1.0:
        problems.append(("rollout.temperature", f"={cfg.rollout.temperature}: the service's trainer scores tokens at "
                                                "temperature 1, so the sampler's logprobs at another temperature would "
                                                "not be the old policy's: set it to 1.0"))
    spec = get_algorithm(cfg.algorithm.name)
    terms = (("algorithm.kl_coef", cfg.algorithm.kl_coef > 0 and "kl" in spec.loss_terms, "a KL term"),
             ("algorithm.entropy_coef", cfg.algorithm.entropy_coef != 0 and "entropy" in spec.loss_terms,
              "an entropy term"),
             ("algorithm.tis_cap", cfg.algorithm.tis_cap > 0, "truncated importance weights"))
    problems += [(key, f"asks for {what}; the service's built-in losses (ppo, importance_sampling) have none: set it "
                       "to 0, or train with --backbone=debug") for key, on, what in terms if on]
    return problems


def translate(cfg: AjetConfig, *, resume: bool = False) -> str | None:
    """None: the service takes no config file; `tinker.*` and `model.lora` are its settings."""
    return None


def run(cfg: AjetConfig, *, with_ray: bool, resume: bool, workflow: WorkflowArg | None = None) -> Path:
    """Run the RL recipe with its update on the service; return the run directory."""
    try:
        import tinker  # noqa: F401  # the SDK: only when the backbone runs
    except ImportError as err:
        raise UserError("--backbone=tinker needs the Tinker SDK: pip install 'ajet[tinker]'") from err
    # The recipe imports torch: this package is on the path of ajet --dry-run (registry.checked_backbone).
    from ajet.backbones.tinker.recipe import TinkerRecipe
    from ajet.training.recipe import run_recipe

    return run_recipe(TinkerRecipe(cfg, workflow=workflow, resume=resume))
