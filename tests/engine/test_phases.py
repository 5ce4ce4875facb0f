"""Tests for the phase state machine."""

from __future__ import annotations

import json

import pytest

from hf_hybrid.engine.phases import Phase, PhaseController, PhaseSchedule

W, F, P, C = Phase.WARMUP, Phase.FULL, Phase.PREDICT, Phase.CORRECT


class _Horizon:
    """choose_horizon stub: returns a fixed value and records the caps it was asked with."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.caps: list[int] = []

    def __call__(self, cap: int) -> int:
        self.caps.append(cap)
        return self.value


def _schedule(**overrides: object) -> PhaseSchedule:
    kwargs: dict[str, object] = {
        "warmup_steps": 3,
        "full_steps": 2,
        "min_predict_steps": 2,
        "max_predict_steps": 8,
        "confidence_threshold": 0.5,
        "correction_interval": 0,
        "min_history": 1,
    }
    kwargs.update(overrides)
    return PhaseSchedule(**kwargs)  # type: ignore[arg-type]


def _run(
    ctrl: PhaseController, n: int, horizon: _Horizon, confidence: float = 1.0, history: int = 100
) -> list[Phase]:
    return [ctrl.decide(confidence, history, horizon) for _ in range(n)]


class TestPhase:
    def test_index_and_backward(self) -> None:
        assert [p.index for p in Phase] == [0, 1, 2, 3]
        assert [p.runs_backward for p in Phase] == [True, True, False, True]
        assert Phase("predict") is Phase.PREDICT


class TestPhaseSchedule:
    @pytest.mark.parametrize("name", ["warmup_steps", "full_steps", "correction_interval", "min_history"])
    def test_negative_budget_refused(self, name: str) -> None:
        with pytest.raises(ValueError, match=f"`{name}` must be an integer >= [01], got -1"):
            PhaseSchedule(**{name: -1})  # type: ignore[arg-type]

    @pytest.mark.parametrize(("lo", "hi"), [(0, 4), (5, 4)])
    def test_predict_bounds_refused(self, lo: int, hi: int) -> None:
        with pytest.raises(ValueError, match="min_predict_steps"):
            PhaseSchedule(min_predict_steps=lo, max_predict_steps=hi)


class TestCycle:
    def test_exact_budgets(self) -> None:
        ctrl = PhaseController(_schedule())
        horizon = _Horizon(3)
        phases = _run(ctrl, 3 + 2 + 3 + 1 + 2 + 3 + 1 + 1, horizon)
        assert phases == [W, W, W, F, F, P, P, P, C, F, F, P, P, P, C, F]
        assert ctrl.steps_decided == len(phases)
        assert horizon.caps == [8, 8]  # asked only when a phase opens, with the cap
        assert ctrl.horizon == 3

    def test_in_predict_phase_flag(self) -> None:
        ctrl = PhaseController(_schedule(warmup_steps=1, full_steps=1))
        horizon = _Horizon(2)
        flags = []
        for _ in range(6):
            ctrl.decide(1.0, 100, horizon)
            flags.append((ctrl.phase, ctrl.in_predict_phase))
        assert flags == [(W, False), (F, False), (P, True), (P, True), (C, False), (F, False)]

    @pytest.mark.parametrize(("asked", "expected"), [(100, 8), (1, 2), (5, 5)])
    def test_horizon_clamped_to_bounds(self, asked: int, expected: int) -> None:
        ctrl = PhaseController(_schedule(warmup_steps=0, full_steps=0))
        phases = _run(ctrl, expected + 2, _Horizon(asked))
        assert ctrl.horizon == expected
        assert phases == [P] * expected + [C, P]

    def test_horizon_capped_by_horizon_cap(self) -> None:
        ctrl = PhaseController(_schedule(warmup_steps=0, full_steps=0))
        ctrl.horizon_cap = 4
        horizon = _Horizon(8)
        phases = _run(ctrl, 5, horizon)
        assert horizon.caps == [4]
        assert phases == [P, P, P, P, C]

    def test_no_predict_before_min_history(self) -> None:
        ctrl = PhaseController(_schedule(min_history=5))
        horizon = _Horizon(2)
        phases = [ctrl.decide(1.0, history, horizon) for history in range(10)]
        assert phases[:3] == [W, W, W]
        # full budget (steps 3, 4) then history 5 reached at step 5
        assert phases[3:5] == [F, F]
        assert phases[5:] == [P, P, C, F, F]
        assert horizon.caps == [8]

    def test_no_predict_below_confidence_threshold(self) -> None:
        ctrl = PhaseController(_schedule())
        horizon = _Horizon(2)
        phases = _run(ctrl, 30, horizon, confidence=0.49)
        assert P not in phases and C not in phases
        assert horizon.caps == []
        assert ctrl.decide(0.5, 100, horizon) is P  # at the threshold: allowed

    def test_correction_interval_inserts_correct_steps(self) -> None:
        ctrl = PhaseController(_schedule(warmup_steps=1, full_steps=2, correction_interval=2))
        horizon = _Horizon(5)
        phases = _run(ctrl, 1 + 2 + 5 + 3 + 2 + 1, horizon)
        assert phases == [W, F, F, P, P, C, P, P, C, P, C, F, F, P]
        assert horizon.caps == [8, 8]

    def test_intermediate_correct_keeps_phase_open(self) -> None:
        ctrl = PhaseController(_schedule(warmup_steps=0, full_steps=0, correction_interval=1))
        horizon = _Horizon(3)
        seen = []
        for _ in range(6):
            phase = ctrl.decide(1.0, 100, horizon)
            seen.append((phase, ctrl.in_predict_phase, ctrl.predict_remaining))
        assert seen == [
            (P, True, 2),
            (C, True, 2),
            (P, True, 1),
            (C, True, 1),
            (P, True, 0),
            (C, False, 0),
        ]

    def test_zero_full_steps_goes_straight_back_to_predict(self) -> None:
        ctrl = PhaseController(_schedule(warmup_steps=1, full_steps=0))
        assert _run(ctrl, 6, _Horizon(2)) == [W, P, P, C, P, P]


class TestForcedAndAdaptation:
    def test_force_full_abandons_open_phase(self) -> None:
        ctrl = PhaseController(_schedule(warmup_steps=1, full_steps=2))
        horizon = _Horizon(6)
        assert _run(ctrl, 5, horizon) == [W, F, F, P, P]
        ctrl.force_full(3)
        assert not ctrl.in_predict_phase
        assert ctrl.predict_remaining == 0 and ctrl.predicted_since_correct == 0
        # the 3 forced steps are this cycle's FULL budget (not added to it), then a new phase opens
        # (no CORRECT for the abandoned one)
        assert _run(ctrl, 3 + 1, horizon) == [F, F, F, P]
        assert horizon.caps == [8, 8]

    def test_force_full_takes_the_larger_budget(self) -> None:
        ctrl = PhaseController(_schedule(warmup_steps=0, full_steps=0))
        ctrl.force_full(4)
        ctrl.force_full(2)
        assert ctrl.forced_full_remaining == 4
        assert _run(ctrl, 5, _Horizon(2)) == [F, F, F, F, P]

    def test_force_full_during_warmup_applies_after_it(self) -> None:
        ctrl = PhaseController(_schedule(warmup_steps=2, full_steps=1))
        horizon = _Horizon(2)
        ctrl.decide(1.0, 100, horizon)
        ctrl.force_full(2)
        assert _run(ctrl, 1 + 2 + 1 + 1, horizon) == [W, F, F, F, P]

    def test_force_full_negative_refused(self) -> None:
        with pytest.raises(ValueError, match="`steps` must be >= 0"):
            PhaseController(_schedule()).force_full(-1)

    def test_shorten_halves_remaining_and_cap(self) -> None:
        ctrl = PhaseController(
            _schedule(warmup_steps=0, full_steps=0, min_predict_steps=3, max_predict_steps=16)
        )
        horizon = _Horizon(16)
        ctrl.decide(1.0, 100, horizon)
        assert ctrl.predict_remaining == 15
        ctrl.shorten()
        assert ctrl.predict_remaining == 7
        assert ctrl.horizon_cap == 8
        ctrl.shorten()
        ctrl.shorten()
        assert ctrl.horizon_cap == 3  # floored at min_predict_steps
        assert ctrl.predict_remaining == 1
        assert _run(ctrl, 3, horizon) == [P, C, P]
        assert horizon.caps == [16, 3]

    def test_relax_grows_cap_back_to_max(self) -> None:
        ctrl = PhaseController(_schedule(max_predict_steps=16))
        ctrl.horizon_cap = 3
        ctrl.relax()
        assert ctrl.horizon_cap == 6
        ctrl.relax()
        ctrl.relax()
        assert ctrl.horizon_cap == 16


class TestState:
    @pytest.mark.parametrize("split", [0, 2, 4, 6, 7, 9, 11, 13])
    def test_round_trip_continues_identically(self, split: int) -> None:
        schedule = _schedule(warmup_steps=2, full_steps=2, correction_interval=2)
        confidences = [1.0, 1.0, 1.0, 0.2, 1.0, 1.0, 1.0, 1.0] * 6
        a = PhaseController(schedule)
        for i in range(split):
            a.decide(confidences[i], 100, _Horizon(5))
        if split == 6:
            a.force_full(1)
        state = json.loads(json.dumps(a.state_dict()))
        b = PhaseController(schedule)
        b.load_state_dict(state)
        assert b.state_dict() == a.state_dict()
        rest_a = [a.decide(c, 100, _Horizon(5)) for c in confidences[split:]]
        rest_b = [b.decide(c, 100, _Horizon(5)) for c in confidences[split:]]
        assert rest_a == rest_b
        assert P in rest_a or split > 30
        assert a.state_dict() == b.state_dict()

    def test_mid_phase_state_fields(self) -> None:
        ctrl = PhaseController(_schedule(warmup_steps=0, full_steps=0))
        _run(ctrl, 2, _Horizon(4))
        state = ctrl.state_dict()
        assert state["phase"] == "predict"
        assert state["predict_remaining"] == 2
        assert state["horizon"] == 4

    def test_fresh_state_round_trip(self) -> None:
        a = PhaseController(_schedule())
        b = PhaseController(_schedule())
        b.load_state_dict(a.state_dict())
        assert b.phase is None
        assert b.state_dict() == a.state_dict()

    def test_schedule_mismatch_refused(self) -> None:
        state = PhaseController(_schedule(full_steps=2)).state_dict()
        other = PhaseController(_schedule(full_steps=3))
        with pytest.raises(ValueError, match="phase schedule differs"):
            other.load_state_dict(state)
        assert other.steps_decided == 0
