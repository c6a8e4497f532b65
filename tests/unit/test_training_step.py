"""The one optimizer step every recipe uses: non-finite steps are skipped, counted, and stop the run."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import torch

from ajet.config.schema import AjetConfig, LoggingConfig, TrainerConfig
from ajet.errors import EXIT_USER, DivergedError
from ajet.outputs.metrics import MetricsLogger
from ajet.training.loop import TrainingLoop
from ajet.training.optim import build_optimizer
from ajet.training.recipe import Closers
from ajet.training.step import OptimizerStep


class Seq:
    """A packed sequence stand-in: the step only needs `entry_pos` (sequences without any are skipped)."""

    def __init__(self, x: torch.Tensor) -> None:
        self.entry_pos, self.x = [0], x


@pytest.fixture()
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def run(step: OptimizerStep, model: torch.nn.Module, *, poison: str = "", index: int = 1):
    """One step over two sequences; `poison` puts a NaN into the loss, a named term, or the gradient."""
    seqs = [Seq(torch.ones(1, 4)), Seq(torch.full((1, 4), 2.0))]

    def seq_loss(seq: Seq):
        loss = model(seq.x).pow(2).sum()
        terms = {"kl": 0.1}
        if poison == "loss" and seq is seqs[1]:
            loss = loss * float("nan")
        if poison == "kl":
            terms["kl"] = float("inf")
        if poison == "grad":  # finite value, infinite gradient: d/dx sqrt(x) at 0
            loss = loss + torch.sqrt(model.weight.sum() * 0)
        return loss, terms

    return step.run(seqs, seq_loss, step=index)


@pytest.mark.parametrize(("poison", "term"), [("loss", "loss"), ("kl", "kl"), ("grad", "gradient norm")])
def test_a_non_finite_step_leaves_the_weights_untouched_and_is_counted(model, caplog, poison, term) -> None:
    cfg = TrainerConfig(lr=0.1)
    step = OptimizerStep(model, build_optimizer(model, cfg)[0], cfg)
    before = weights(model)
    with caplog.at_level(logging.WARNING, logger="ajet.training.step"):
        result = run(step, model, poison=poison, index=7)
    assert result.skipped and result.nonfinite == [term]
    assert all(torch.equal(a, b) for a, b in zip(before, weights(model), strict=True))
    assert all(p.grad is None for p in model.parameters())
    assert step.metrics() == {"actor/nonfinite_steps": 1.0}
    assert "step 7" in caplog.text and term in caplog.text
    # A finite step afterwards trains again and resets the count in a row, not the total.
    assert not run(step, model).skipped
    assert not all(torch.equal(a, b) for a, b in zip(before, weights(model), strict=True))
    assert step.nonfinite_in_a_row == 0 and step.metrics() == {"actor/nonfinite_steps": 1.0}


def test_max_nonfinite_steps_in_a_row_stop_the_run_with_a_fix(model) -> None:
    cfg = TrainerConfig(lr=0.1, max_nonfinite_steps=2)
    step = OptimizerStep(model, build_optimizer(model, cfg)[0], cfg)
    run(step, model, poison="loss", index=1)
    run(step, model, index=2)  # a good step in between: the count in a row starts over
    run(step, model, poison="loss", index=3)
    with pytest.raises(DivergedError) as err:
        run(step, model, poison="loss", index=4)
    assert err.value.exit_code == EXIT_USER
    message = str(err.value)
    assert "step 4" in message and "trainer.lr" in message and "algorithm.tis_cap" in message
    assert "trainer.grad_clip" in message


def test_a_nan_metric_is_logged_as_nan_not_dropped(tmp_path) -> None:
    metrics = MetricsLogger(tmp_path, LoggingConfig(tensorboard=False), run_name="t", config_dict={})
    metrics.log(1, {"actor/loss": float("nan"), "actor/grad_norm": float("inf"), "ok": 1.0})
    metrics.close()
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record["ok"] == 1.0
    assert record["actor/loss"] != record["actor/loss"]  # NaN
    assert record["actor/grad_norm"] == float("inf")


def test_a_step_without_an_optimizer_step_does_not_warn_about_the_schedule(model, tmp_path) -> None:
    """The schedule advances once per training step, also when the step skipped optimizer.step()."""
    cfg = AjetConfig()
    cfg.trainer.total_steps, cfg.logging.tensorboard, cfg.logging.quiet = 2, False, True
    cfg.trainer.save_final_model = False
    closers = Closers()
    loop = TrainingLoop(cfg, tmp_path, closers, total_steps=2)
    optimizer, scheduler = build_optimizer(model, cfg.trainer)
    loop.attach(model, None, optimizer, scheduler)
    loop.save_checkpoint = lambda: None  # nothing to check here
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with loop.steps() as steps:
            for _ in steps:
                loop.commit({"actor/skipped_update": 1.0})
    closers.close_all()
    assert scheduler.last_epoch == 2
    assert not [w for w in caught if "lr_scheduler" in str(w.message)]



def test_the_optimizer_is_torch_fused_adamw_and_updates_as_the_default_loop_does() -> None:
    torch.manual_seed(0)
    fused_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    loop_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    loop_model.load_state_dict(fused_model.state_dict())
    before = [p.detach().clone() for p in fused_model.parameters()]
    fused, _ = build_optimizer(fused_model, TrainerConfig(lr=1e-2, weight_decay=0.1))
    loop = torch.optim.AdamW(loop_model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    assert fused.defaults["fused"] is True
    for _ in range(5):
        x = torch.randn(3, 8)
        for model, optimizer in ((fused_model, fused), (loop_model, loop)):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    for new, old, reference in zip(fused_model.parameters(), before, loop_model.parameters(), strict=True):
        assert (new - old).abs().max() > 1e-3  # the steps moved every parameter
        assert torch.allclose(new, reference, atol=1e-6, rtol=0)


def test_trainer_bf16_null_is_autocast_where_the_cpu_multiplies_bf16_natively(model, monkeypatch, caplog) -> None:
    """`trainer.bf16: null` turns autocast on where oneDNN has native bf16 matmuls (avx512_bf16,
    AMX) and off where it would emulate them (AVX2 only); true and false are kept as said."""
    import ajet.engine.weights
    from ajet.training import step as step_module

    for native in (True, False):
        step_module.native_bf16.cache_clear()  # a new process, as far as the answer goes
        monkeypatch.setattr(ajet.engine.weights, "has_bf16_gemm", lambda native=native: native)
        with caplog.at_level(logging.INFO, logger="ajet.training.step"):
            assert step_module.resolve_bf16(None, model) is native
            assert step_module.resolve_bf16(True, model) is True and step_module.resolve_bf16(False, model) is False
            optimizer_step = OptimizerStep(model, torch.optim.SGD(model.parameters(), lr=0.1), TrainerConfig(bf16=None))
        assert optimizer_step.bf16 is native
    step_module.native_bf16.cache_clear()  # the real machine's answer for the tests after this one
    said = [r.getMessage() for r in caplog.records if "trainer.bf16 null" in r.getMessage()]
    assert len(said) == 2 and "autocast on" in said[0] and "autocast off" in said[1], said  # once per answer
