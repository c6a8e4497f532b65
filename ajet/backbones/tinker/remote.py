"""The service side of a tinker-backbone run: one Tinker session, one LoRA training client, and
the sampler of its latest weights. Every call goes through the official SDK (`tinker`, the
`ajet[tinker]` extra), imported here only: this module loads when the backbone runs.

- `start`: the training client (a new LoRA adapter, or one restored from a saved state with its
  optimizer for `--resume`), checked at once against what the run needs (the model, the loss):
  a service that cannot train the run fails here, naming what it lacks;
- `train`: the step's datums as `forward_backward` with the algorithm's built-in loss, then
  `optim_step` (per PPO epoch); the service's metrics;
- `save_state`: the training client's weights and optimizer, saved by the service (a checkpoint's
  remote half); `sampler`: its weights saved for sampling and a new sampling client on them.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from ajet.backbones.tinker.datums import RemoteDatum
from ajet.config.schema import AjetConfig
from ajet.errors import InfrastructureError, UserError

log = logging.getLogger(__name__)

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def lora_targets(target_modules: list[str]) -> dict[str, bool] | None:
    """`model.lora.target_modules` as `create_lora_training_client`'s train_attn / train_mlp /
    train_unembed (pure); None when it names part of a group or another module (not expressible)."""
    names = set(target_modules)
    if names - set(ATTN) - set(MLP) - {"lm_head"}:
        return None
    attn, mlp = names & set(ATTN), names & set(MLP)
    if attn not in (set(), set(ATTN)) or mlp not in (set(), set(MLP)) or not names:
        return None
    return {"train_attn": bool(attn), "train_mlp": bool(mlp), "train_unembed": "lm_head" in names}


class RemoteTrainer:
    def __init__(self, cfg: AjetConfig) -> None:
        import tinker  # the SDK (pip install 'ajet[tinker]'): only when the backbone runs

        self.cfg = cfg
        self.timeout = cfg.tinker.request_timeout_s
        self._tinker = tinker
        self.where = cfg.tinker.base_url or "$TINKER_BASE_URL / the SDK's default"
        try:  # "" = None: the SDK reads $TINKER_BASE_URL and $TINKER_API_KEY
            self.client = tinker.ServiceClient(base_url=cfg.tinker.base_url or None, api_key=cfg.tinker.api_key or None)
        except (tinker.TinkerError, ValueError) as err:
            raise UserError(f"cannot open a Tinker session at {self.where}: {err} (tinker.api_key or "
                            "$TINKER_API_KEY; tinker.base_url)") from err
        self.training: Any = None
        self.tag = secrets.token_hex(3)  # names this attempt's saves apart from an earlier attempt's

    def _result(self, future: Any, what: str) -> Any:
        """`future.result()`, its failure re-raised naming what was asked and of whom."""
        try:
            return future.result(timeout=self.timeout)
        except self._tinker.BadRequestError as err:
            raise UserError(f"the Tinker service at {self.where} refused {what}: {err}") from err
        except (self._tinker.TinkerError, TimeoutError) as err:
            raise InfrastructureError(f"the Tinker service at {self.where} failed {what}: {err}") from err

    def start(self, *, resume_from: str | None, loss_fn: str, loss_fn_config: dict[str, float] | None) -> None:
        """The training client; then a forward with the run's loss, so a service that lacks it
        fails now, not after the first rollout."""
        t, lora = self.cfg.tinker, self.cfg.model.lora
        if resume_from:
            self.training = self._result(self.client.create_training_client_from_state_with_optimizer(resume_from),
                                         f"to restore the training state {resume_from} (--resume)")
        else:
            targets = lora_targets(lora.target_modules)
            assert targets is not None  # check_config refuses the others
            self.training = self._result(
                self.client.create_lora_training_client(
                    base_model=t.base_model, rank=lora.r, seed=self.cfg.project.seed, train_attn=targets["train_attn"],
                    train_mlp=targets["train_mlp"], train_unembed=targets["train_unembed"]),
                f"a LoRA training client of rank {lora.r} on base_model={t.base_model!r}")
        probe = [self.datum(RemoteDatum(model_input=[0], target_tokens=[1], logprobs=[0.0], advantages=[0.0]))]
        self._result(self.training.forward(probe, loss_fn, loss_fn_config),
                     f"loss_fn={loss_fn!r}, the loss algorithm.name={self.cfg.algorithm.name} trains with")

    def tokenizer(self) -> Any:
        return self.training.get_tokenizer()

    def datum(self, d: RemoteDatum) -> Any:
        types = self._tinker.types
        return types.Datum(model_input=types.ModelInput.from_ints(d.model_input),
                           loss_fn_inputs={"target_tokens": d.target_tokens, "logprobs": d.logprobs,
                                           "advantages": d.advantages})

    def train(self, datums: list[RemoteDatum], loss_fn: str, loss_fn_config: dict[str, float] | None, *,
              learning_rate: float, epochs: int) -> tuple[dict[str, float], list[list[float]]]:
        """`epochs` x (forward_backward, optim_step): the service's metrics (summed losses averaged
        over the epochs) and the first forward's logprobs per datum (the weights the sampler had)."""
        trainer = self.cfg.trainer
        adam = self._tinker.types.AdamParams(learning_rate=learning_rate, beta1=0.9, beta2=0.999, eps=1e-8,
                                             weight_decay=trainer.weight_decay, grad_clip_norm=trainer.grad_clip)
        data = [self.datum(d) for d in datums]
        metrics: dict[str, float] = {}
        first: list[list[float]] = []
        for epoch in range(epochs):
            # Both requests are queued at once; the service runs a client's requests in order.
            backward = self.training.forward_backward(data, loss_fn, loss_fn_config)
            step = self.training.optim_step(adam)
            out = self._result(backward, f"forward_backward ({len(data)} datums, loss_fn={loss_fn!r})")
            optim = self._result(step, "optim_step")
            if epoch == 0:
                first = [list(o["logprobs"].tolist()) for o in out.loss_fn_outputs]
            for key, value in [*out.metrics.items(), *(optim.metrics or {}).items()]:
                name = f"tinker/{key.replace(':', '_')}"
                metrics[name] = metrics.get(name, 0.0) + float(value) / epochs
        if "tinker/loss_sum" in metrics:
            metrics["actor/loss"] = metrics["tinker/loss_sum"]
        return metrics, first

    def save_state(self, step: int) -> str:
        """The training client's weights and optimizer, saved by the service; its path."""
        return str(self._result(self.training.save_state(f"ajet-{self.tag}-step_{step:06d}"),
                                f"save_state of step {step}").path)

    def sampler_path(self, name: str) -> str:
        """The weights saved for sampling under `name`; their path."""
        return str(self._result(self.training.save_weights_for_sampler(f"ajet-{self.tag}-{name}"),
                                f"save_weights_for_sampler ({name})").path)

    def sampler(self, name: str) -> Any:
        """A sampling client on the current weights (saved for sampling as `name` first)."""
        path = self.sampler_path(name)
        return self._result(self.client.create_sampling_client(model_path=path), f"a sampling client of {path}")

    def close(self) -> None:
        """Ends the session (the service unloads its clients; saved states stay)."""
        self._result(self.client.close("success"), "to close the session")
