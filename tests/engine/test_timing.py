"""PartTimer: time goes to the innermost open part, `outside()` to none; the engine on a fake clock."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hf_hybrid.engine.config import EngineConfig
from hf_hybrid.engine.engine import HybridEngine, StepRecord
from hf_hybrid.engine.phases import Phase, PhaseSchedule
from hf_hybrid.engine.timing import PartTimer


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_time_goes_to_the_innermost_open_part_and_outside_to_none() -> None:
    clock = FakeClock()
    timer = PartTimer(clock)
    timer.start_step()
    with timer.part("trainer"):
        clock.advance(1.0)
        with timer.part("score"):
            clock.advance(2.0)
            with timer.outside():
                clock.advance(100.0)  # the plain step's own work
            clock.advance(4.0)
        clock.advance(8.0)
    clock.advance(16.0)  # between parts: nobody's
    timer.end_step()
    assert timer.seconds == {"trainer": 9.0, "score": 6.0}
    assert timer.total == 15.0
    assert (timer.step_seconds, timer.steps) == (131.0, 1)
    summary = timer.summary()
    assert summary["engine_time_share"] == pytest.approx(15.0 / 131.0)
    assert summary["parts"] == {"score": pytest.approx(6.0 / 131.0), "trainer": pytest.approx(9.0 / 131.0)}


def test_a_step_ends_once_and_the_state_round_trips() -> None:
    clock = FakeClock()
    timer = PartTimer(clock)
    timer.end_step()  # no step started: nothing to count
    timer.start_step()
    clock.advance(3.0)
    timer.end_step()
    timer.end_step()
    with timer.part("guard"):
        clock.advance(1.0)
    again = PartTimer(clock)
    again.load_state_dict(timer.state_dict())
    assert (again.seconds, again.step_seconds, again.steps) == ({"guard": 1.0}, 3.0, 1)
    assert again.summary() == timer.summary()


def _engine(clock: FakeClock) -> tuple[HybridEngine, dict[str, torch.Tensor], torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    params = dict(model.named_parameters())
    schedule = PhaseSchedule(warmup_steps=2, full_steps=1, confidence_threshold=0.0, min_history=2)
    engine = HybridEngine(params, EngineConfig(schedule=schedule, predictor="ema"))
    engine.timer.clock = clock
    return engine, params, torch.optim.SGD(model.parameters(), lr=0.1)


def test_the_engine_charges_its_parts_and_not_the_optimizer_step() -> None:
    clock = FakeClock()
    engine, params, optimizer = _engine(clock)
    slow_guess = engine.watch.sampled_guess

    def guess(steps_ahead: int):  # the engine's own work, made measurable on the fake clock
        clock.advance(1.0)
        return slow_guess(steps_ahead)

    engine.watch.sampled_guess = guess
    phases = []
    for _ in range(12):
        plan = engine.begin_step()
        phases.append(plan.phase)
        if plan.phase.runs_backward:
            for p in params.values():
                p.grad = torch.ones_like(p)

        def step() -> None:
            clock.advance(1000.0)  # the optimizer's own work: charged to no part
            optimizer.step()

        engine.finish_step(StepRecord(1.0, 1.0, 0.1), step)
    scored = sum(p in (Phase.FULL, Phase.CORRECT) for p in phases)
    assert Phase.PREDICT in phases and scored > 0
    timing = engine.timing()
    charged = {part: seconds for part, seconds in timing["part_seconds"].items() if seconds}
    assert charged == {"guess": float(scored)}
    real = sum(p.runs_backward for p in phases)
    assert timing["step_seconds"] == 1000.0 * real + scored  # the step span includes the optimizer
    assert engine.seconds == timing["engine_seconds"] == float(scored)
