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

if TYPE_CHECKING:
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

