"""A predictor that misbehaves, aimed at a chosen phase, through wrapper predictors registered for the test.

Predictors are consulted in FULL and CORRECT steps too (the engine scores a one-step-ahead guess
against the real update), never in WARMUP. Expected outcomes:

| predictor returns | FULL / CORRECT (guess only scored)        | PREDICT (guess applied)                 |
|-------------------|-------------------------------------------|-----------------------------------------|
| NaN / inf         | predictor reset; the real step is kept    | refused: rollback, reset, forced FULL   |
| enormous (1e30)   | scored: confidence drops to 0, no phase   | clipped to the trust region, applied    |
| wrong shape       | predictor reset; the real step is kept    | refused: rollback, reset, forced FULL   |
| raises            | predictor reset; the real step is kept    | refused: rollback, reset, forced FULL   |
| -50x its guess, every predict step from step 14 on | rollbacks (each counted), horizon shrinks  |

A wrongly shaped guess in a FULL or CORRECT step used to crash training (the scoring dot product);
the engine now checks shapes with every other predictor failure.
"""

from __future__ import annotations

import math

import pytest
import torch
from harness import (
    PREDICTOR_FAULTS,
    StepWatch,
    Trigger,
    assert_loss_recovered,
    confidently_wrong,
    fault_predictor,
    faulted_trainer,
    timeline_after,
)
from helpers import EveryStep
from transformers import TrainerCallback

MIN_HISTORY = 4  # helpers.hybrid_args default: real updates needed before a predict phase


def _run(tmp_path, invariants, phase, fault, **overrides):
    cls = fault_predictor(fault)
    trainer, trigger = faulted_trainer(tmp_path, invariants, phase, hybrid_predictor=cls.name, **overrides)
    cls.trigger = trigger
    watch = StepWatch(trainer, trigger)
    trainer.add_callback(watch)
    trainer.train()
    invariants.verify()
    assert len(trigger.steps) == 1 and cls.calls_faulted >= 1, f"the fault never fired in a {phase} step"
    return trainer, trigger, watch, trigger.steps[0], cls


def _real_steps_before_next_predict(trainer, step):
    rest = [row["phase"] for row in trainer.hybrid_timeline[step + 1 :]]
    return rest.index("predict") if "predict" in rest else len(rest)


@pytest.mark.parametrize("phase", ["full", "predict", "correct"])
@pytest.mark.parametrize("fault", ["nan", "inf", "wrong_shape", "raises"])
def test_unusable_prediction_resets_the_predictor(tmp_path, invariants, fault, phase):
    trainer, trigger, watch, step, cls = _run(tmp_path, invariants, phase, PREDICTOR_FAULTS[fault])
    row = trainer.hybrid_timeline[step]
    record = watch.steps[step]
    assert cls.resets >= 1
    failed = "predictor_errors" if fault in ("wrong_shape", "raises") else "refused_updates"
    assert watch.grew(step, failed) == 1
    if phase == "predict":  # refused: the whole phase is undone and the predictor starts over
        assert row["rolled_back"] and watch.restored(step)
        assert watch.grew(step, "refused_updates") == 1
        assert record["observed"] == 0
        assert timeline_after(trainer, step, 3) == ["full"] * 3
    else:  # only a score was lost: the real step is applied as always
        assert not row["rolled_back"] and not watch.unchanged(step)
        assert not record["optimizer_unchanged"]
        assert record["observed"] == 1  # reset, then this step's real update
    # a reset predictor needs min_history real updates before it may predict again
    assert _real_steps_before_next_predict(trainer, step) >= MIN_HISTORY - record["observed"]
    assert_loss_recovered(trainer, trigger.firings[0])


@pytest.mark.parametrize("phase", ["full", "predict", "correct"])
def test_enormous_prediction(tmp_path, invariants, phase):
    trainer, trigger, watch, step, _ = _run(
        tmp_path,
        invariants,
        phase,
        PREDICTOR_FAULTS["enormous"],
        hybrid_confidence_threshold=0.05,
    )
    record = watch.steps[step]
    if phase == "predict":  # held to the trust region: per tensor at most max_delta of the weight
        max_delta = trainer.engine.config.max_delta
        assert watch.grew(step, "clipped_tensors") >= 1
        for name, before in record["before"].items():
            change = float((record["after"][name] - before).norm())
            assert change <= max_delta * float(before.norm()) * (1 + 1e-5) + 1e-7, name
        assert not watch.unchanged(step)
    else:  # scored only: a guess 1e30 off has skill << 0, so confidence collapses and no phase opens
        assert record["confidence"] == 0.0
        assert "predict" not in timeline_after(trainer, step, 8)
        assert watch.grew(step, "refused_updates") == 0
    assert_loss_recovered(trainer, trigger.firings[0])


def test_a_predictor_is_never_consulted_in_warmup(tmp_path, invariants):
    cls = fault_predictor(PREDICTOR_FAULTS["raises"])
    trainer, trigger = faulted_trainer(
        tmp_path, invariants, "warmup", hybrid_predictor=cls.name, max_steps=14
    )
    cls.trigger = Trigger(trainer, "warmup", times=100)
    trainer.train()
    invariants.verify()
    assert cls.calls_faulted == 0 and trainer.hybrid_stats()["predictor_errors"] == 0
    # it still observed: densely near the end of warmup, every 8th (averaged) update before that
    assert 0 < trainer.engine.predictor.observed < 14


@pytest.mark.parametrize("check_every", [1, 0], ids=["checked", "blind"])
def test_confidently_wrong_predictor_is_rolled_back_every_time(tmp_path, invariants, check_every):
    """From step 14 on, every predicted step is -50x the EMA guess, under a loose trust region
    (max_delta 1.0): the loss jumps during each predict phase (e.g. 3.8 -> 5.3). Checked predict steps
    catch it at once; blind ones only at the CORRECT step right after the phase (loss-regression test
    against the pre-phase forecast). At least 2/3 of the faulted phases must end in a rollback or a
    forced FULL, every rollback must be counted, and the horizon cap must shrink to its minimum."""
    cls = fault_predictor(confidently_wrong(-50.0))
    trainer, trigger = faulted_trainer(
        tmp_path,
        invariants,
        "predict",
        aim={"after": 14, "times": 10**6},
        hybrid_predictor=cls.name,
        hybrid_check_every=check_every,
        hybrid_max_delta=1.0,  # a loose trust region, so the wrong guesses really hurt
        max_steps=60,
    )
    cls.trigger = trigger
    caps: list[int] = []
    trainer.add_callback(EveryStep(trainer, lambda t: caps.append(t.engine.controller.horizon_cap)))
    trainer.train()
    invariants.verify()
    timeline = trainer.hybrid_timeline
    letters = "".join(row["phase"][0] for row in timeline)
    stats = trainer.hybrid_stats()
    assert stats["rollbacks"] == sum(row["rolled_back"] for row in timeline)  # every rollback counted
    assert stats["rollbacks"] >= 2, letters
    # each faulted phase: the run of predicted steps and the step that follows it
    phases = []
    i = 0
    while i < len(timeline):
        if timeline[i]["phase"] == "predict" and i in trigger.steps:
            j = i
            while j < len(timeline) and timeline[j]["phase"] == "predict":
                j += 1
            phases.append(timeline[i : j + 1])
            i = j
        i += 1
    assert phases, letters
    caught = [rows for rows in phases if any(r["rolled_back"] or r["level"] >= 2 for r in rows)]
    # a phase whose guesses only nudged the loss within its noise may pass; most must not
    assert len(caught) >= max(2, 2 * len(phases) // 3), [
        [(r["phase"], r["level"]) for r in p] for p in phases
    ]
    if check_every == 0:  # blind: only the CORRECT step can see it, by the loss-regression test
        assert all(r["phase"] == "correct" for rows in phases for r in rows if r["rolled_back"])
    assert min(caps) == trainer.engine.config.schedule.min_predict_steps
    first = trigger.firings[0]
    assert_loss_recovered(trainer, first)
    assert math.isfinite(first.pre_loss_mean)


class _PhaseEnds(TrainerCallback):
    """For every step that ends an open predict phase with an action: (step, action, phase, weights back
    on the phase's snapshot, weights changed by the step)."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.ends: list[tuple[int, str, str, bool, bool]] = []

    def on_step_begin(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        self.snapshot = {n: t.clone() for n, t in engine.guard.snapshot.items()}
        self.before = {n: p.detach().clone() for n, p in engine.params.items()}

    def on_step_end(self, args, state, control, **kwargs):
        row, params = self.trainer.hybrid_timeline[-1], self.trainer.engine.params
        if row["action"] != "continue" and self.snapshot:
            back = all(torch.equal(self.snapshot[n], p) for n, p in params.items())
            moved = any(not torch.equal(self.before[n], p) for n, p in params.items())
            self.ends.append((state.global_step - 1, row["action"], row["phase"], back, moved))


@pytest.mark.parametrize("check_every", [1, 0], ids=["checked", "blind"])
def test_without_rollback_a_failed_phase_keeps_its_weights_and_trains_on(tmp_path, invariants, check_every):
    """`hybrid_rollback=False` through the Trainer (docs/usage.md: `hybrid_rollback` rolls back a predict
    phase whose loss regressed or diverged; off, nothing is put back): the confidently wrong predictor of
    the test above, and not one phase is rolled back. Each failed phase ends in a forced FULL that keeps
    the weights the phase reached (a rollback puts its snapshot back): a checked predict step that sees the
    damage applies nothing more; a CORRECT step that sees it keeps its real update."""
    cls = fault_predictor(confidently_wrong(-50.0))
    trainer, trigger = faulted_trainer(
        tmp_path,
        invariants,
        "predict",
        aim={"after": 14, "times": 10**6},
        hybrid_predictor=cls.name,
        hybrid_check_every=check_every,
        hybrid_max_delta=1.0,
        hybrid_rollback=False,
        max_steps=60,
    )
    cls.trigger = trigger
    ends = _PhaseEnds(trainer)
    trainer.add_callback(ends)
    trainer.train()
    invariants.verify()  # among them: each step did exactly the action it reports
    stats, timeline = trainer.hybrid_stats(), trainer.hybrid_timeline
    letters = "".join(row["phase"][0] for row in timeline)
    assert trigger.firings and stats["rollbacks"] == 0 and not any(r["rolled_back"] for r in timeline)
    failed = [end for end in ends.ends if end[1] == "force_full"]
    assert len(failed) >= 2 and not [end for end in ends.ends if end[1] == "rollback"], (letters, ends.ends)
    for step, _, phase, back, moved in failed:
        assert not back, f"step {step}: the weights were put back on the phase's snapshot"
        assert moved is (phase == "correct"), (step, phase)  # a CORRECT step's real update is kept
        after = [r["phase"] for r in timeline[step + 1 : step + 3]]
        assert after == ["full"] * len(after), (step, after)  # FULL forced
    if check_every == 0:  # blind: only the CORRECT step can see the damage
        assert all(phase == "correct" for _, _, phase, _, _ in failed)
