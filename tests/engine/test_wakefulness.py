"""When the engine sleeps, wakes and how often it looks (`wakefulness.py`), through the engine."""

from __future__ import annotations

from engine_loop import (
    Loop,
    equal,
)

from hf_hybrid.engine.engine import EngineConfig
from hf_hybrid.engine.phases import Phase, PhaseSchedule


class TestDormant:
    """Far below the threshold the engine watches real updates only every n-th step; training is unchanged."""

    @staticmethod
    def _run(dormant_every: int, force: bool) -> Loop:
        schedule = PhaseSchedule(warmup_steps=5, full_steps=3, confidence_threshold=0.999, min_history=4)
        loop = Loop(EngineConfig(schedule=schedule, dormant_every=dormant_every))
        if force:
            loop.engine.wakefulness.dormant = lambda confidence: True  # whatever this problem's skill
        loop.run(80)
        return loop

    def test_observes_every_nth_full_step_and_trains_identically(self) -> None:
        dormant, awake = self._run(8, force=True), self._run(1, force=False)
        assert [r.plan.phase for r in dormant.records] == [r.plan.phase for r in awake.records]
        assert Phase.PREDICT not in {r.plan.phase for r in awake.records}
        assert equal(dormant.params, awake.params)  # the optimizer stepped every step in both
        assert dormant.optimizer_calls == awake.optimizer_calls == 80
        assert awake.engine.predictor.observed == 80
        assert dormant.engine.predictor.observed == 5 + 75 // 8  # warmup, then every 8th FULL step
        # asleep, it keeps the sampled coordinates only; awake (dormant_every=1), the whole parameters
        assert not dormant.engine.awake and awake.engine.awake
        sample = dormant.engine.watch.sample
        sampled = {n: sample.gather(n, e) for n, e in awake.engine.predictor.ema.items()}
        assert {n: e.shape for n, e in dormant.engine.predictor.ema.items()} == {
            n: e.shape for n, e in sampled.items()
        }
        # (the averaged update itself is checked exactly in test_updates.py)

    def test_a_reachable_threshold_keeps_it_awake(self) -> None:
        schedule = PhaseSchedule(warmup_steps=5, full_steps=3, confidence_threshold=0.0, min_history=4)
        loop = Loop(EngineConfig(schedule=schedule, dormant_every=8))
        loop.run(40)
        assert not loop.engine.wakefulness.dormant(loop.engine.confidence)

    def test_a_sudden_jump_in_confidence_wakes_it_before_a_phase_opens(self) -> None:
        """Asleep, the predictor guesses sampled coordinates only: a confidence that leaps past the threshold
        in one step must first wake the engine (a FULL step), never open a phase on the sampled predictor."""
        schedule = PhaseSchedule(warmup_steps=5, full_steps=3, confidence_threshold=0.9, min_history=4)
        loop = Loop(EngineConfig(schedule=schedule, dormant_every=8))
        loop.engine.wakefulness.dormant = lambda confidence: True  # asleep, whatever this problem's skill
        loop.run(30)
        assert not loop.engine.awake
        del loop.engine.wakefulness.dormant
        loop.engine.confidence = lambda: 1.0  # the leap: from asleep to certain in one step
        awake_at_begin = []
        for _ in range(30):
            awake_at_begin.append(loop.engine.awake)
            loop.step()
        phases = loop.phases(30)
        assert Phase.PREDICT in phases and loop.engine.awake
        pairs = zip(awake_at_begin, phases, strict=True)
        assert all(awake for awake, phase in pairs if phase is Phase.PREDICT)
        predicted = [r.outcome for r in loop.records[30:] if r.outcome.phase is Phase.PREDICT]
        assert all(o.applied_update for o in predicted), [o.reasons for o in predicted]
