"""The plain PyTorch training loop the engine's tests drive it with (no transformers): a 2-layer MLP
regression trained by AdamW, every step recorded; and a divergence monitor that raises what a test scripts."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hf_hybrid.engine.alarm import Alarm
from hf_hybrid.engine.divergence import DivergenceLevel, DivergenceMonitor
from hf_hybrid.engine.engine import EngineConfig, HybridEngine, StepOutcome, StepPlan, StepRecord
from hf_hybrid.engine.guard import clip_to_trust_region
from hf_hybrid.engine.phases import Phase, PhaseSchedule

LR = 1e-2


def engine_config(predictor: str = "ema", check_every: int = 1, **schedule: Any) -> EngineConfig:
    kwargs: dict[str, Any] = {"warmup_steps": 10, "full_steps": 3, "confidence_threshold": 0.0}
    kwargs.update(schedule)
    return EngineConfig(schedule=PhaseSchedule(**kwargs), predictor=predictor, check_every=check_every)


def clone(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in params.items()}


def equal(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n].detach(), b[n].detach()) for n in a)


def finite(params: Mapping[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in params.values())


def optimizer_state(opt: torch.optim.Optimizer) -> dict[int, dict[str, Any]]:
    return copy.deepcopy(opt.state_dict()["state"])


def same_optimizer_state(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]]) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        if a[key].keys() != b[key].keys():
            return False
        for name in a[key]:
            x, y = a[key][name], b[key][name]
            if not (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y):
                return False
    return True


@dataclass
class Record:
    plan: StepPlan
    outcome: StepOutcome
    before: dict[str, torch.Tensor]
    after: dict[str, torch.Tensor]
    optimizer_calls: int
    expected_delta: dict[str, torch.Tensor] | None = None
    optimizer_state_unchanged: bool | None = None


@dataclass
class Loop:
    """A 2-layer MLP regression on fixed random data, trained by AdamW through the engine."""

    config: EngineConfig
    seed: int = 0
    records: list[Record] = field(default_factory=list)
    optimizer_calls: int = 0
    optimizer_calls_in_predict: int = 0

    def __post_init__(self) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            self.model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.x = torch.randn(64, 8, generator=gen)
        self.y = self.x @ torch.randn(8, 1, generator=gen) + 0.1 * torch.randn(64, 1, generator=gen)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.params = dict(self.model.named_parameters())
        self.engine = HybridEngine(self.params, self.config)
        self._phase: Phase | None = None

    def _optimizer_step(self) -> None:
        self.optimizer_calls += 1
        if self._phase is Phase.PREDICT:
            self.optimizer_calls_in_predict += 1
        self.opt.step()

    def _loss(self) -> torch.Tensor:
        return nn.functional.mse_loss(self.model(self.x), self.y)

    def _expected_predicted_delta(self) -> dict[str, torch.Tensor] | None:
        """What the engine should apply in this predict step, computed independently of the guard."""
        engine = self.engine
        try:
            predicted = engine.predictor.predict(engine.steps_since_real + 1)
        except RuntimeError:  # a faulty test predictor
            return None
        if predicted is None:
            return None
        scale = engine.corrector.scale
        return {
            n: clip_to_trust_region(t * scale, self.params[n], engine.config.max_delta)[0]
            for n, t in predicted.items()
        }

    def step(self, loss_override: float | None = None, grad_norm_override: float | None = None) -> Record:
        plan = self.engine.begin_step()
        self._phase = plan.phase
        before = clone(self.params)
        calls = self.optimizer_calls
        expected = None
        opt_state = None
        if plan.phase.runs_backward:
            self.opt.zero_grad()
            loss = self._loss()
            loss.backward()
            grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
            value: float | None = loss.item() if loss_override is None else loss_override
            if grad_norm_override is not None:
                grad_norm = grad_norm_override
            outcome = self.engine.finish_step(StepRecord(value, grad_norm, LR), self._optimizer_step)
        else:
            value = None
            if plan.measure_loss:
                with torch.no_grad():
                    value = self._loss().item()
            if loss_override is not None:
                value = loss_override
            expected = self._expected_predicted_delta()
            opt_state = optimizer_state(self.opt)
            outcome = self.engine.finish_step(StepRecord(value, None, LR), self._optimizer_step)
        record = Record(plan, outcome, before, clone(self.params), self.optimizer_calls - calls, expected)
        if opt_state is not None:
            record.optimizer_state_unchanged = same_optimizer_state(opt_state, optimizer_state(self.opt))
        self.records.append(record)
        return record

    def run(self, steps: int) -> list[Record]:
        return [self.step() for _ in range(steps)]

    def run_until(self, condition: Any, limit: int = 200) -> None:
        """Step until `condition(loop)` holds right after begin_step would be called next."""
        for _ in range(limit):
            if condition(self):
                return
            self.step()
        raise AssertionError("condition never met")

    def phases(self, start: int = 0) -> list[Phase]:
        return [r.plan.phase for r in self.records[start:]]


def mid_phase_with_moved_params(loop: Loop) -> bool:
    """Last step: an applied PREDICT step; the phase is still open and params differ from its snapshot."""
    if not loop.records:
        return False
    last = loop.records[-1]
    return (
        last.plan.phase is Phase.PREDICT
        and last.outcome.applied_update
        and loop.engine.controller.phase is Phase.PREDICT
        and loop.engine.controller.predict_remaining > 0
        and not equal(loop.engine.guard.snapshot, loop.params)
    )


class ScriptedMonitor(DivergenceMonitor):
    """The monitor, silent on its own (no z-score before 10**6 steps), reporting `next_level` once."""

    def __init__(self) -> None:
        super().__init__(min_history=10**6)
        self.next_level: DivergenceLevel | None = None

    def check(
        self, loss: float | None, grad_norm: float | None = None, prediction_error: float | None = None
    ) -> list[Alarm]:
        alarms = super().check(loss, grad_norm, prediction_error)
        if self.next_level is None:
            return alarms
        level, self.next_level = self.next_level, None
        return [Alarm(level, f"scripted {level.name}")]


def scripted_loop(config: EngineConfig) -> tuple[Loop, ScriptedMonitor]:
    loop = Loop(config)
    monitor = ScriptedMonitor()
    loop.engine.monitor = monitor
    return loop, monitor


def no_rollback(config: EngineConfig) -> EngineConfig:
    return dataclasses.replace(config, rollback=False)
