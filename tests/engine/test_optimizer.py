"""HybridOptimizer: the real optimizer passed through, its `step` routed through the engine."""

from __future__ import annotations

import torch
from torch import nn

from hf_hybrid import EngineConfig, HybridEngine, HybridOptimizer, PhaseSchedule, StepRecord
from hf_hybrid.engine.phases import Phase


def _setup(script: tuple[str, ...]):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = PhaseSchedule(warmup_steps=2, script=tuple(Phase(p) for p in script))
    config = EngineConfig(schedule=schedule, check_every=1)
    engine = HybridEngine(dict(model.named_parameters()), config, optimizer=inner)
    measured: dict[str, float | None] = {"loss": None, "grad_norm": None}
    optimizer = HybridOptimizer(
        inner, engine, lambda: StepRecord(measured["loss"], measured["grad_norm"], learning_rate=1e-2)
    )
    return model, inner, engine, optimizer, measured


def test_state_and_groups_are_the_real_optimizers():
    model, inner, _, optimizer, _ = _setup(("full",))
    assert optimizer.param_groups is inner.param_groups and optimizer.defaults is inner.defaults
    optimizer.param_groups[0]["lr"] = 5e-3
    assert inner.param_groups[0]["lr"] == 5e-3
    model(torch.ones(2, 4)).sum().backward()
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert optimizer.state_dict() == inner.state_dict() and optimizer.state is inner.state


def test_step_runs_the_real_step_or_the_predicted_update_and_says_which():
    script = ("warmup", "warmup", "full", "full", "full", "predict", "predict", "correct")
    model, inner, engine, optimizer, measured = _setup(script)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    predicted_flags = []
    for phase in script:
        plan = engine.begin_step()
        assert plan.phase.value == phase
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        if plan.phase.runs_backward:
            loss.backward()
            measured["grad_norm"] = float(nn.utils.clip_grad_norm_(model.parameters(), 1e9))
        else:
            measured["grad_norm"] = None
        measured["loss"] = loss.item()
        real_steps_before = inner.state[model.weight].get("step", torch.tensor(0.0)).item()
        weight_before = model.weight.detach().clone()
        optimizer.step()
        real_steps_after = inner.state[model.weight]["step"].item()
        predicted_flags.append(optimizer.step_was_predicted)
        assert optimizer.last_outcome.phase.value == phase
        if plan.phase.runs_backward:
            assert real_steps_after == real_steps_before + 1
        else:  # the optimizer is untouched, the weights moved by the predicted update
            assert real_steps_after == real_steps_before
            assert not torch.equal(model.weight, weight_before)
    assert predicted_flags == [phase == "predict" for phase in script]


def test_train_and_eval_reach_a_schedule_free_optimizer_and_are_optional_otherwise():
    calls = []

    class ScheduleFree(torch.optim.SGD):
        def train(self):
            calls.append("train")

        def eval(self):
            calls.append("eval")

    model = nn.Linear(2, 1)
    engine = HybridEngine(dict(model.named_parameters()), EngineConfig())
    record = lambda: StepRecord(0.0, 0.0, 0.1)  # noqa: E731
    HybridOptimizer(ScheduleFree(model.parameters(), lr=0.1), engine, record).train()
    HybridOptimizer(ScheduleFree(model.parameters(), lr=0.1), engine, record).eval()
    assert calls == ["train", "eval"]
    HybridOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), engine, record).train()  # has none: no error
