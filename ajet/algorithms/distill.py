"""On-policy distillation advantages, as pure functions over plain Python data (no torch).

The student samples its episodes; a teacher scores every sampled token on the very same token
ids (`ajet.training.teacher`). Each trained token's advantage is then

    (teacher_logprob - student_logprob) + reward_coef * reward_advantage

The first term is minus the per-token reverse KL, log q(x)/p(x) with x drawn from the student
q: the policy gradient with it as the advantage lowers KL(student || teacher) (the Tinker
cookbook's and TRL's GKD-on-policy recipe with one sample per token). The student's logprob is
the one recorded at sampling time (the engine's, what the tokens were drawn from). The second
term mixes in the task reward's GRPO advantage (`distill.reward_coef`, 0 = pure distillation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ajet.algorithms import grpo
from ajet.algorithms.base import AlgorithmSpec, Problems, clipped_policy_loss

if TYPE_CHECKING:
    from ajet.config.schema import AjetConfig
    from ajet.context.types import Sample

# A teacher logprob below this is taken as this: a token the teacher deems impossible (e.g. -inf
# under a masked vocabulary) still gives a finite, strongly negative advantage.
LOGPROB_FLOOR = -50.0


def distill_advantages(
    samples: Sequence[Sample], teacher_logprobs: Sequence[Sequence[float]], reward_coef: float = 0.0
) -> dict[str, float]:
    """Set each sample's per-token `advantage` (in place) to the distillation advantage above;
    0 at untrained tokens. `sample.advantage` holds the reward's advantage on the way in (what
    `assign_token_advantages` wrote; empty = 0). Returns the step's metrics over trained tokens:

    - `distill/reverse_kl`: mean of student - teacher logprob, an estimate of KL(student || teacher);
    - `distill/agreement`: mean of min(1, p_teacher / p_student), an estimate of 1 - the total
      variation distance between the two (the acceptance rate of speculative sampling): 1 when
      the teacher would have drawn the student's tokens as often;
    - `distill/teacher_logprob`, `distill/tokens`.
    """
    if len(teacher_logprobs) != len(samples):
        raise ValueError(f"{len(samples)} samples but teacher logprobs for {len(teacher_logprobs)}")
    kl = agreement = teacher_sum = 0.0
    tokens = 0
    for index, (sample, teacher) in enumerate(zip(samples, teacher_logprobs, strict=True)):
        n = len(sample.input_ids)
        if len(teacher) != n:
            raise ValueError(f"sample {index} has {n} tokens but {len(teacher)} teacher logprobs")
        reward_adv = sample.advantage or [0.0] * n
        advantage = [0.0] * n
        for t in range(n):
            if not sample.loss_mask[t]:
                continue
            teacher_lp = float(teacher[t])
            if math.isnan(teacher_lp):
                raise ValueError(f"sample {index}, token {t}: the teacher's logprob is NaN; the teacher "
                                 "model's weights or the endpoint's reply are broken")
            teacher_lp = min(max(teacher_lp, LOGPROB_FLOOR), 0.0)
            student_lp = float(sample.old_logprobs[t])
            gap = teacher_lp - student_lp
            advantage[t] = gap + reward_coef * float(reward_adv[t])
            kl -= gap
            agreement += math.exp(min(gap, 0.0))
            teacher_sum += teacher_lp
            tokens += 1
        sample.advantage = advantage
    if not tokens:
        return {"distill/tokens": 0.0}
    return {
        "distill/reverse_kl": kl / tokens,
        "distill/agreement": agreement / tokens,
        "distill/teacher_logprob": teacher_sum / tokens,
        "distill/tokens": float(tokens),
    }



def config_problems(cfg: AjetConfig) -> Problems:
    """A teacher, and settings that fit learning from every episode."""
    out: Problems = []
    d = cfg.distill
    if not d.teacher:
        out.append(("distill.teacher", "required for distillation: a local checkpoint directory (e.g. an earlier "
                                       "run's final_model/), a peft adapter directory, or a teacher endpoint URL "
                                       "(http://host:8000/v1)"))
    elif "://" in d.teacher and not d.teacher.startswith(("http://", "https://")):
        out.append(("distill.teacher", f"{d.teacher!r}: an endpoint must be an http:// or https:// URL"))
    if d.reward_coef > 0 and cfg.rollout.n < 2:
        out.append(("rollout.n", f"distill.reward_coef={d.reward_coef} mixes in the task reward's group advantage, "
                                 "which needs rollout.n >= 2"))
    if cfg.rollout.dynamic_sampling.enabled and d.reward_coef <= 0:
        out.append(("rollout.dynamic_sampling.enabled", "drops groups whose rewards agree, but distillation learns "
                                                        "from every episode (the teacher scores each token); set it "
                                                        "to false, or mix in the reward with distill.reward_coef > 0"))
    return out


SPEC = AlgorithmSpec(
    name="distill",
    summary="on-policy distillation: a teacher scores the student's tokens (reverse KL as the advantage)",
    recipe="rl",
    # The task reward's part, scaled by distill.reward_coef; the teacher's part is added after
    # the teacher scores the samples (`distill_advantages`).
    advantages=grpo.advantages,
    loss=clipped_policy_loss,
    loss_terms=("policy", "kl", "entropy"),
    teacher=True,
    config_problems=config_problems,
    elsewhere="on-policy distillation (a teacher scores the student's tokens) runs on the debug backbone "
              "only; the adapter has no teacher scoring step. Use --backbone=debug, or grpo",
)
