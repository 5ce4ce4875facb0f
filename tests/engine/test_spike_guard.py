"""The spike guard in a plain PyTorch loop, through `HybridEngine` (the path that ships): a clean run
left untouched, bad batches skipped, outsized updates taken back, damaged weights restored after
patience, copies, cap, resume."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import pytest
import torch

from hf_hybrid.engine.config import EngineConfig, SpikeGuardConfig
from hf_hybrid.engine.engine import HybridEngine, StepRecord
from hf_hybrid.engine.phases import PhaseSchedule
from hf_hybrid.engine.recovery import RecoveryAction
from hf_hybrid.engine.spike_blame import BLAME_AFTER, MAX_SKIPS
from hf_hybrid.engine.spike_guard import SpikeGuard
from hf_hybrid.engine.validation import ConfigError

STEPS = 120
LOSS_ONLY = {"max_update_ratio": 0.0}  # the loss's path alone: what the guard does where the check is off
NEVER_PREDICT = EngineConfig(schedule=PhaseSchedule(confidence_threshold=1.0))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 8, generator=g)
    return x, x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(1024, 1, generator=g)


class Loop:
    """A small MLP regression with AdamW at lr 1e-2, every step through the engine; the learning rate
    x100 in the `burst` steps, random targets x10 in the `garbage` steps (1-based)."""

    def __init__(
        self, guard: SpikeGuardConfig | None, blame: bool = True, sgd: bool = False, replay: bool = False
    ) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
        kind = torch.optim.SGD if sgd else torch.optim.AdamW
        self.optimizer = kind(self.model.parameters(), lr=1e-2)
        self.x, self.y = _data()
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.guard = None
        if guard is not None:
            measure = self.suspect_loss if blame else None
            clean = KeptBatches(self) if replay else None
            self.guard = SpikeGuard(self.optimizer, guard, suspect_loss=measure, clean_batches=clean)
        params = dict(self.model.named_parameters())
        self.engine = HybridEngine(params, NEVER_PREDICT, self.optimizer, spike_guard=self.guard)
        self.actions: dict[int, RecoveryAction] = {}
        self.before: dict[int, tuple[list[torch.Tensor], dict]] = {}  # state before each step
        self.after: dict[int, tuple[list[torch.Tensor], dict]] = {}  # state after each step

    def suspect_loss(self) -> float:
        with torch.no_grad():
            return float(self._loss(*self.batches[-1]))

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.model(x), y)

    def snapshot(self) -> tuple[list[torch.Tensor], dict]:
        params = [p.detach().clone() for p in self.model.parameters()]
        return params, copy.deepcopy(self.optimizer.state_dict())

    def run(
        self,
        steps: range,
        burst: range = range(0),
        garbage: range = range(0),
        loss_of: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
        keep: bool = False,
        base_lr: float = 1e-2,
        burst_lr: float = 1.0,
        fed: dict[int, int] | None = None,
    ) -> Loop:
        """`fed`: steps that train on another step's batch."""
        for step in steps:
            self.engine.begin_step(step)
            source = (fed or {}).get(step, step)
            batch = torch.arange(source * 32, source * 32 + 32) % 512
            x, y = self.x[batch], self.y[batch]
            if step in garbage:
                y = 10 * torch.randn(y.shape, generator=torch.Generator().manual_seed(step))
            self.batches.append((x, y))
            loss = self._loss(x, y)
            if loss_of is not None:
                loss = loss_of(step, loss)
            self.optimizer.zero_grad()
            loss.backward()
            grad_norm = float(torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters()]))
            lr = burst_lr if step in burst else base_lr
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            if keep:
                self.before[step] = self.snapshot()
            record = StepRecord(float(loss.detach()), grad_norm, lr)
            outcome = self.engine.finish_step(record, self.optimizer.step)
            if keep:
                self.after[step] = self.snapshot()
            self.actions[step] = outcome.action
        return self

    def steps_with(self, action: RecoveryAction) -> list[int]:
        return [step for step, done in self.actions.items() if done is action]

    def eval(self) -> float:
        with torch.no_grad():
            return float(self._loss(self.x[512:], self.y[512:]))


class KeptBatches:
    """The loop's `CleanBatches`: the newest clean batches, trained on as the loop trains."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.kept: list[tuple[int, tuple[torch.Tensor, torch.Tensor]]] = []

    def keep(self, step: int) -> None:
        self.kept = [*self.kept, (step, self.loop.batches[-1])][-MAX_SKIPS:]

    def train_on(self, back: int) -> int | None:
        if back > len(self.kept):
            return None
        step, batch = self.kept[-back]
        self.loop.optimizer.zero_grad()
        self.loop._loss(*batch).backward()
        return step


def _same(a: tuple[list[torch.Tensor], dict], b: tuple[list[torch.Tensor], dict]) -> bool:
    """Weights and every optimizer-state tensor bit-identical."""
    if not all(torch.equal(p, q) for p, q in zip(a[0], b[0], strict=True)):
        return False
    sa, sb = a[1]["state"], b[1]["state"]
    return sa.keys() == sb.keys() and all(
        sa[i].keys() == sb[i].keys() and all(torch.equal(sa[i][k], sb[i][k]) for k in sa[i]) for i in sa
    )


def test_a_clean_run_is_the_plain_loop_bit_for_bit() -> None:
    plain = Loop(None).run(range(1, STEPS + 1))
    guarded = Loop(SpikeGuardConfig(every=10)).run(range(1, STEPS + 1))
    stats = guarded.engine.stats()
    assert stats["restores"] == 0 and stats["skips"] == 0 and stats["skipped_updates"] == 0
    assert set(guarded.actions.values()) == {RecoveryAction.CONTINUE}
    assert all(
        torch.equal(a, b) for a, b in zip(plain.model.parameters(), guarded.model.parameters(), strict=True)
    )
    assert stats["update_check"] and stats["updates_taken_back"] == 0
    assert 0 < stats["largest_update_ratio"] < 10
    assert stats["update_check_copies"] == 0  # no step gave a sign: the weights were never copied
    # two copies of the weights and Adam's two moments (and the step counters), and the update check's
    # copy of the weights
    weights = sum(p.numel() * 4 for p in plain.model.parameters())
    assert 6 * weights + weights <= stats["spike_guard_bytes"] <= 6 * weights + weights + 128


def test_an_lr_burst_is_kept_at_the_last_kept_rate_step_by_step() -> None:
    """Each burst step's update is 100x the recent ones and raises its own batch's loss: it is scaled back
    to the last kept update's rate, which (Adam's update is linear in the rate, its moments the same at
    any rate) is the clean run's step to rounding, so the run goes on as the clean one does."""
    clean = Loop(None).run(range(1, STEPS + 1), keep=True)
    faulted = Loop(None).run(range(1, STEPS + 1), burst=range(80, 83))
    loop = Loop(SpikeGuardConfig(every=10)).run(range(1, STEPS + 1), burst=range(80, 83), keep=True)
    stats = loop.engine.stats()
    assert loop.steps_with(RecoveryAction.SKIP) == [80, 81, 82] == stats["taken_back_steps"]
    assert stats["scaled_back_steps"] == [80, 81, 82] and stats["spike_skipped_steps"] == 0
    assert stats["skip_steps"] == [80, 81, 82] and stats["restores"] == 0 and stats["skipped_updates"] == 3
    assert stats["update_check_copies"] == 3  # each burst step's lr is 100x that of the last kept update
    for step in (80, 81, 82):
        weights, state = loop.after[step]
        assert not all(torch.equal(p, q) for p, q in zip(weights, loop.before[step][0], strict=True))
        assert all(
            torch.allclose(p, q, rtol=0, atol=1e-6)
            for p, q in zip(weights, clean.after[step][0], strict=True)
        )
        assert state["state"][0]["step"] == loop.before[step][1]["state"][0]["step"] + 1  # moments moved on
    assert not _same(loop.before[83], loop.after[83])
    damage = faulted.eval() - clean.eval()
    assert damage > 0.1
    assert abs(loop.eval() - clean.eval()) < 0.05 * damage


def test_an_outsized_update_that_lowers_its_batch_loss_stays() -> None:
    """A schedule's own jump (lr x100 from step 61 on, as a restart would): the updates are outsized, but
    each lowers its own batch's loss, so the run is the unguarded one bit for bit."""
    plain = Loop(None).run(range(1, 61), base_lr=1e-4).run(range(61, STEPS + 1))
    guarded = Loop(SpikeGuardConfig(every=10)).run(range(1, 61), base_lr=1e-4).run(range(61, STEPS + 1))
    stats = guarded.engine.stats()
    assert stats["largest_update_ratio"] > 10 and stats["updates_taken_back"] == 0  # judged, and left
    # the jump's first step is copied and judged; from then on its rate is the kept one's: no sign
    assert stats["update_check_copies"] == 1 and stats["unjudged_updates"] > 0
    assert all(
        torch.equal(a, b) for a, b in zip(plain.model.parameters(), guarded.model.parameters(), strict=True)
    )


def test_a_gradient_spike_under_sgd_is_taken_back_through_the_detectors_ratio() -> None:
    """Plain SGD, the learning rate unchanged, step 80's gradient 200x its size (the loss's value as it
    was, so the loss's path sees nothing): the update is 200x the recent ones. The only sign before it is
    the gradient norm against the detector's window, which the guard hands to the update check: the
    weights are copied first and the update, which overshoots its own batch, is taken back."""

    def spike(step: int, loss: torch.Tensor) -> torch.Tensor:
        return loss + 199.0 * (loss - loss.detach()) if step == 80 else loss

    loop = Loop(SpikeGuardConfig(every=10), sgd=True).run(range(1, 91), loss_of=spike, keep=True)
    stats = loop.engine.stats()
    assert stats["update_check_copies"] == 1 and stats["unjudged_updates"] == 0
    assert stats["taken_back_steps"] == [80] == loop.steps_with(RecoveryAction.SKIP)
    assert all(torch.equal(p, q) for p, q in zip(loop.after[80][0], loop.before[80][0], strict=True))


def test_an_lr_burst_blames_the_weights_waits_then_restores() -> None:
    """Where the update check is off (its copy too dear), the loss's path undoes the burst."""
    clean = Loop(None).run(range(1, STEPS + 1))
    faulted = Loop(None).run(range(1, STEPS + 1), burst=range(80, 83))
    loop = Loop(SpikeGuardConfig(every=10, **LOSS_ONLY)).run(range(1, STEPS + 1), burst=range(80, 83))
    stats = loop.engine.stats()
    restored = loop.steps_with(RecoveryAction.RESTORE)
    assert restored == stats["restore_steps"] and len(restored) >= 1
    patience = loop.guard.config.patience
    assert all(81 + patience - 1 <= s <= 84 + patience for s in restored), restored
    assert stats["blamed_weights"] >= patience and stats["skips"] == 0
    damage = faulted.eval() - clean.eval()
    assert damage > 0.1, "the burst must hurt the unguarded run for this test to mean anything"
    assert abs(loop.eval() - clean.eval()) < 0.2 * damage


def test_a_restore_inside_an_lr_excursion_goes_back_to_before_the_jump(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The burst's updates stay (judged not outsized here, as a classifier's that lower their own batch's
    loss stay), the loss's path blames the weights while the rate is still up: the restore puts back the
    update check's copy from before the rate jumped (the weights after step 79, bit for bit, the optimizer
    keeping its state), not the schedule's copy of step 70: fewer clean batches are given back."""
    caplog.set_level(logging.WARNING, logger="hf_hybrid")
    config = SpikeGuardConfig(every=10, max_update_ratio=1e6)
    loop = Loop(config).run(range(1, STEPS + 1), burst=range(80, 83), keep=True)
    stats = loop.engine.stats()
    restored = loop.steps_with(RecoveryAction.RESTORE)
    assert restored == stats["restore_steps"] and len(restored) == 1 and restored[0] <= 83, restored
    step = restored[0]
    assert stats["updates_taken_back"] == 0 and stats["update_check_copies"] >= 1
    weights, state = loop.after[step]
    assert all(torch.equal(p, q) for p, q in zip(weights, loop.after[79][0], strict=True))
    assert state["state"][0]["step"] > loop.after[79][1]["state"][0]["step"]  # the optimizer's state kept
    assert stats["spike_skipped_steps"] == step - 79
    assert "the update check's copy, from before the rate jumped) of step 79" in caplog.text
    loss_only = Loop(SpikeGuardConfig(every=10, **LOSS_ONLY)).run(range(1, STEPS + 1), burst=range(80, 83))
    assert loss_only.engine.stats()["spike_skipped_steps"] > stats["spike_skipped_steps"]


def test_a_restore_at_the_step_an_excursion_is_taken_back_goes_back_to_before_the_jump() -> None:
    """The MiniLM full fine-tune's case: the rate comes back down at step 83 and the check's verdict takes
    the excursion back, while at the same step the loss's path restores (here the step losses of 82-83
    are shown raised, their gradients left as they were). The restore wins and goes back to the check's
    copy of before the jump (after step 79), not to the schedule's copy of step 70."""

    def shown(step: int, loss: torch.Tensor) -> torch.Tensor:
        return loss + 5.0 if step in (82, 83) else loss

    loop = Loop(SpikeGuardConfig(every=10)).run(
        range(1, STEPS + 1), burst=range(80, 83), burst_lr=0.3, loss_of=shown, keep=True
    )
    stats = loop.engine.stats()
    assert loop.steps_with(RecoveryAction.RESTORE) == [83] == stats["restore_steps"]
    assert stats["updates_taken_back"] == 0 and stats["spike_skipped_steps"] == 4
    assert all(torch.equal(p, q) for p, q in zip(loop.after[83][0], loop.after[79][0], strict=True))


def test_a_bad_batch_is_blamed_skipped_and_changes_nothing() -> None:
    loop = Loop(SpikeGuardConfig(every=10)).run(range(1, 101), garbage=range(60, 62), keep=True)
    assert loop.steps_with(RecoveryAction.SKIP) == [60, 61] == loop.engine.stats()["skip_steps"]
    assert loop.engine.stats()["blamed_data"] == 2 and loop.engine.stats()["restores"] == 0
    for step in (60, 61):
        assert _same(loop.before[step], loop.after[step])
    assert not _same(loop.before[62], loop.after[62])  # the next, clean step is applied


def test_blamed_batches_steps_train_on_the_newest_clean_batches_newest_first() -> None:
    """Random targets in steps 60-61, both gross: step 60 trains on step 59's batch, step 61 on step 58's
    (the i-th skip in a row on the i-th newest clean step), bit for bit the plain loop fed those batches;
    the predictor's watch takes the replayed update as a real one (no phase ever opens here)."""
    loop = Loop(SpikeGuardConfig(every=10), replay=True).run(range(1, 101), garbage=range(60, 62), keep=True)
    stats = loop.engine.stats()
    assert stats["skip_steps"] == [60, 61] == stats["replay_steps"] and stats["replays"] == 2
    plain = Loop(None).run(range(1, 101), fed={60: 59, 61: 58}, keep=True)
    assert all(_same(loop.after[s], plain.after[s]) for s in (60, 61, 100))
    assert not _same(loop.before[60], loop.after[60])


def test_a_replay_is_said_and_only_a_blamed_batch_is_replaced(caplog: pytest.LogCaptureFixture) -> None:
    """The skip's warning names the step whose batches were trained on; a non-finite step and an outsized
    update are skipped or taken back, never replaced (their batch is not to blame)."""
    loop = Loop(SpikeGuardConfig(every=10), replay=True).run(range(1, 81))
    with caplog.at_level(logging.WARNING, logger="hf_hybrid"):
        loop.run(range(81, 84), garbage=range(82, 83))
    said = [r.message for r in caplog.records if ": skip: " in r.message]
    assert len(said) == 1 and "trained the step on the clean batches of step 81" in said[0], said
    loop.run(range(84, 90), burst=range(85, 86))
    nan = float("nan")
    loop.run(range(90, 92), loss_of=lambda step, loss: loss * nan if step == 91 else loss)
    stats = loop.engine.stats()
    assert stats["replay_steps"] == [82] and 85 in stats["taken_back_steps"] and 91 not in stats["skip_steps"]


@pytest.mark.parametrize(("hard", "skipped"), [(range(81, 84), []), (range(81, 87), [84])])
def test_a_run_of_hard_batches_is_skipped_from_its_second_firing_step(hard: range, skipped: list) -> None:
    """Batches with noisy targets (the loss up ~5x, a lasting shift but no sudden spike), as hard at the
    trusted weights: the data is blamed. The shift's first firing step is left alone (clean runs have
    single hard batches); the next one in a row is skipped as a run of bad batches. Nothing is restored."""
    loop = Loop(SpikeGuardConfig(every=10)).run(range(1, 81))
    clean_targets = loop.y.clone()
    loop.y = clean_targets + 0.6 * torch.randn(
        clean_targets.shape, generator=torch.Generator().manual_seed(1)
    )
    loop.run(hard, keep=True)
    loop.y = clean_targets
    loop.run(range(hard.stop, 100))
    stats = loop.engine.stats()
    assert stats["skip_steps"] == skipped == loop.steps_with(RecoveryAction.SKIP)
    assert (
        stats["blamed_data"] >= 1 + len(skipped) and stats["blamed_weights"] == 0 and stats["restores"] == 0
    )
    assert all(_same(loop.before[s], loop.after[s]) for s in skipped)


def test_a_hard_clean_batch_of_a_nearly_fitted_run_is_not_gross_but_garbage_is() -> None:
    """Every 16th batch is a hard one (noisy targets, as a classifier's few examples it cannot fit come
    round each epoch): once the run fits the rest, such a batch is many times the level (the detector
    fires on it, and it is as hard at the trusted weights: the data's), but no harder than the hard batches
    of the window before it, so it is left alone. Random targets far above any batch the run has seen are
    skipped at once."""
    loop = Loop(SpikeGuardConfig(every=10))
    clean_y = loop.y.clone()
    noisy = clean_y + 0.5 * torch.randn(clean_y.shape, generator=torch.Generator().manual_seed(2))
    for step in range(1, 201):
        loop.y = noisy if step % 16 == 0 else clean_y
        loop.run(range(step, step + 1))
    loop.y = clean_y
    stats = loop.engine.stats()
    assert stats["blamed_data"] >= 3  # the hard batches fired, blamed on the data
    assert loop.guard.detector.level() * 3 < max(loop.guard.detector.losses)  # many times the level
    assert stats["skips"] == 0 and stats["restores"] == 0, stats["skip_steps"]  # a level-only rule: 5
    loop.run(range(201, 204), garbage=range(202, 203))
    assert loop.engine.stats()["skip_steps"] == [202]


def test_a_restore_puts_back_the_trusted_copy_exactly() -> None:
    """Weights and every optimizer-state tensor equal the state after the trusted copy's step."""
    loop = Loop(SpikeGuardConfig(every=10)).run(range(1, 81), keep=True)
    trusted = loop.guard.trusted.step
    assert trusted is not None
    loop.run(range(81, 81 + loop.guard.config.patience), loss_of=lambda s, loss: loss + 50.0, keep=True)
    (step,) = loop.steps_with(RecoveryAction.RESTORE)
    assert _same(loop.after[step], loop.after[trusted])
    assert loop.engine.stats()["spike_skipped_steps"] == step - trusted


def test_a_spike_that_comes_back_by_itself_is_left_alone() -> None:
    """Fewer firing steps than the patience, blamed on the weights: nothing undone, nothing skipped."""
    loop = Loop(SpikeGuardConfig(every=10))
    loop.run(range(1, 81))
    short = range(81, 81 + loop.guard.config.patience - 1)
    loop.run(range(81, STEPS + 1), loss_of=lambda s, loss: loss + (5.0 if s in short else 0.0))
    stats = loop.engine.stats()
    assert stats["blamed_weights"] == len(short) and stats["restores"] == 0 and stats["skips"] == 0
    assert loop.guard.suspect_since is None  # the suspicion ended
    assert loop.guard.trusted.step is not None and loop.guard.trusted.step > 81  # copies go on


def test_without_a_second_measurement_sudden_spikes_are_the_batches_until_they_repeat() -> None:
    loop = Loop(SpikeGuardConfig(every=5, trust_after=1), blame=False).run(range(1, 41))
    loop.run(range(41, 41 + BLAME_AFTER + loop.guard.config.patience + 2), garbage=range(41, 200))
    skips, restores = loop.steps_with(RecoveryAction.SKIP), loop.steps_with(RecoveryAction.RESTORE)
    assert skips[:BLAME_AFTER] == list(range(41, 41 + BLAME_AFTER))
    assert restores == [41 + BLAME_AFTER + loop.guard.config.patience - 1]


def test_after_a_restore_spikes_are_bad_batches_up_to_a_cap() -> None:
    loop = Loop(SpikeGuardConfig(every=5, trust_after=1, **LOSS_ONLY)).run(range(1, 40))
    loop.run(range(40, 60), burst=range(40, 41))
    assert loop.steps_with(RecoveryAction.RESTORE)
    after = range(60, 60 + MAX_SKIPS + 2)
    loop.run(after, garbage=after)
    assert loop.steps_with(RecoveryAction.SKIP) == list(after)[:MAX_SKIPS]  # then the run trains on


def test_restores_are_capped_per_window(caplog: pytest.LogCaptureFixture) -> None:
    guard = SpikeGuardConfig(every=5, trust_after=1, max_restores=1, window=1000, patience=1, **LOSS_ONLY)
    loop = Loop(guard).run(range(1, 41))
    with caplog.at_level(logging.WARNING, logger="hf_hybrid"):
        loop.run(range(41, 61), burst=range(40, 60))
    assert len(loop.steps_with(RecoveryAction.RESTORE)) == 1
    assert sum("stops restoring" in r.message for r in caplog.records) >= 1


def test_non_finite_steps_are_skipped_by_the_rule_and_are_not_spikes() -> None:
    loop = Loop(SpikeGuardConfig(every=10)).run(range(1, 41))
    nan = float("nan")
    loop.run(range(41, 43), loss_of=lambda step, loss: loss * nan, keep=True)
    assert loop.steps_with(RecoveryAction.SKIP) == [41, 42]
    stats = loop.engine.stats()
    assert stats["skips"] == 0 and stats["skipped_updates"] == 2 and stats["nonfinite_real_steps"] == 2
    assert all(_same(loop.before[s], loop.after[s]) for s in (41, 42))


def test_weights_only_copies_reset_the_optimizer_state_on_a_restore() -> None:
    loop = Loop(SpikeGuardConfig(every=10, storage="weights")).run(range(1, 81), keep=True)
    trusted = loop.guard.trusted.step
    loop.run(range(81, 81 + loop.guard.config.patience), loss_of=lambda s, loss: loss + 50.0, keep=True)
    (step,) = loop.steps_with(RecoveryAction.RESTORE)
    weights, state = loop.after[step]
    assert all(torch.equal(p, q) for p, q in zip(weights, loop.after[trusted][0], strict=True))
    assert state["state"] == {}  # Adam starts its moments again
    weights_bytes = sum(p.numel() * 4 for p in loop.model.parameters())
    assert loop.engine.stats()["spike_guard_bytes"] == 2 * weights_bytes


def test_storage_none_only_skips() -> None:
    loop = Loop(SpikeGuardConfig(every=10, storage="none")).run(range(1, 81))
    loop.run(range(81, 90), burst=range(80, 81), garbage=range(85, 86))
    stats = loop.engine.stats()
    assert stats["restores"] == 0 and stats["spike_guard_bytes"] == 0
    assert 85 in stats["skip_steps"]


@pytest.mark.parametrize(("fields", "acted"), [({}, "taken_back_steps"), (LOSS_ONLY, "restore_steps")])
def test_a_resumed_engine_decides_what_the_uninterrupted_one_does(fields: dict, acted: str) -> None:
    """Saving the engine rebases the guard's copies on the saved state, so a resumed run, which copies
    that state again, restores what the uninterrupted run restores (and no copy is in the saved state);
    the update check's recent norms are saved, so it takes back what the uninterrupted run does."""
    whole = Loop(SpikeGuardConfig(every=10, **fields))
    whole.run(range(1, 61))
    saved = (copy.deepcopy(whole.model.state_dict()), copy.deepcopy(whole.optimizer.state_dict()))
    state = whole.engine.state_dict()
    assert not any(torch.is_tensor(v) for v in state["spike_guard"].values())
    whole.run(range(61, STEPS + 1), burst=range(70, 73))
    resumed = Loop(SpikeGuardConfig(every=10, **fields))
    resumed.model.load_state_dict(saved[0])
    resumed.optimizer.load_state_dict(saved[1])
    resumed.engine.load_state_dict(copy.deepcopy(state))
    resumed.batches = list(whole.batches[:60])
    resumed.run(range(61, STEPS + 1), burst=range(70, 73))
    assert whole.engine.stats()[acted] == resumed.engine.stats()[acted] != []
    assert whole.engine.stats()["restore_steps"] == resumed.engine.stats()["restore_steps"]
    assert all(
        torch.equal(a, b) for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True)
    )


def test_the_copies_spacing_is_kept_in_the_engine_state() -> None:
    """The spacing a run was started with is saved: a resumed run copies at the steps the uninterrupted
    run copies at, whatever its own configuration says (the trainer decides it from bytes at the start)."""
    whole = Loop(SpikeGuardConfig(every=40)).run(range(1, 61))
    state = copy.deepcopy(whole.engine.state_dict())
    assert state["spike_guard"]["copy_every"] == 40
    resumed = Loop(SpikeGuardConfig(every=10))
    resumed.engine.load_state_dict(state)
    resumed.run(range(61, 130))
    assert resumed.engine.stats()["spike_guard_copy_every"] == 40
    assert resumed.guard.trusted.step == 120


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("every", 0),
        ("max_restores", -1),
        ("device", "gpu"),
        ("min_rise", float("nan")),
        ("min_history", 60),
        ("patience", 0),
        ("storage", "disk"),
        ("max_update_ratio", -1.0),
    ],
)
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"`{field}` must be"):
        SpikeGuardConfig(**{field: value})
