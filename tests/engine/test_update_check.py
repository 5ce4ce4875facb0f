"""`UpdateCheck` alone: the weights are copied only before a step that shows a sign of an outsized update
(its learning rate or gradient norm jumps), an outsized update after such a sign is judged by its own
batch's loss, a learning-rate excursion by where the rate goes, and one without a sign stays unjudged
(the loss's path is left to catch it)."""

from __future__ import annotations

import torch

from hf_hybrid.engine.update_check import GRAD_JUMP, LR_JUMP, MAX_EXCURSION, MEASURE_EVERY, UpdateCheck

HISTORY = 20


def _check(raised: bool = True) -> tuple[UpdateCheck, torch.Tensor, list[float]]:
    """A check on one 1000-coordinate tensor whose 'batch loss' is its distance from zero, so a step away
    from zero raises it when `raised` (`check.raised`, changeable); `losses` records each measurement."""
    weights = torch.zeros(1000)
    losses: list[float] = []

    def suspect_loss() -> float:
        loss = float(weights.norm()) if check.raised else -float(weights.norm())
        losses.append(loss)
        return loss

    check = UpdateCheck([weights], max_ratio=10.0, history=50, min_history=HISTORY, suspect_loss=suspect_loss)
    check.raised = raised
    return check, weights, losses


def _step(
    check: UpdateCheck, weights: torch.Tensor, size: float, lr: float, grad_ratio: float, step: int = 0
) -> str | None:
    check.take(step, [lr], grad_ratio)
    weights.add_(size / weights.numel() ** 0.5)  # an update of norm `size`
    return check.judge()


def _steady(check: UpdateCheck, weights: torch.Tensor) -> None:
    for _ in range(HISTORY + 5):
        assert _step(check, weights, 1.0, lr=1e-3, grad_ratio=1.0) is None
    assert check.copies == 0 and check.largest_ratio < 1.01


def test_an_lr_jump_is_copied_judged_and_kept_at_the_last_kept_rate() -> None:
    """The update (linear in the rate) is scaled back to what the last kept rate makes of it: the step is
    kept, at 1/30 of its size, not discarded."""
    check, weights, losses = _check()
    _steady(check, weights)
    before = weights.clone()
    why = _step(check, weights, 100.0, lr=1e-3 * LR_JUMP * 15, grad_ratio=1.0)
    assert why is not None and "100x" in why and check.copies == 1
    assert losses[0] > losses[1]  # after the step, then before it
    update = weights - before
    assert check.take_back() == ([0], True)
    assert torch.allclose(weights, before + update / (LR_JUMP * 15), rtol=0, atol=1e-6)
    assert not torch.equal(weights, before)
    # the next burst step is measured against the last kept update's rate: copied again
    assert _step(check, weights, 100.0, lr=1e-3 * LR_JUMP * 15, grad_ratio=1.0) is not None
    assert check.copies == 2


def test_a_gradient_norm_jump_is_a_sign_too() -> None:
    """Plain SGD: a gradient many times the recent ones makes the update as many times larger."""
    check, weights, _ = _check()
    _steady(check, weights)
    before = weights.clone()
    assert _step(check, weights, 100.0, lr=1e-3, grad_ratio=GRAD_JUMP * 10) is not None
    assert check.copies == 1 and check.unjudged == 0
    assert check.take_back() == ([0], False)  # the rate did not jump: the update is taken back whole
    assert torch.equal(weights, before)


def test_only_the_groups_whose_rate_jumped_are_scaled_back() -> None:
    """Two parameter groups, the first one's rate x30, the second's unchanged: the first group's update
    is kept at its last kept rate, the second's stays whole."""
    first, second = torch.zeros(600), torch.zeros(400)
    check = UpdateCheck(
        [first, second],
        max_ratio=10.0,
        history=50,
        min_history=HISTORY,
        suspect_loss=lambda: float(first.norm()),
        groups=[0, 1],
    )
    for step in range(HISTORY + 5):
        check.take(step, [1e-3, 1e-3], 1.0)
        first.add_(0.03)
        second.add_(0.03)
        assert check.judge() is None
    before = [first.clone(), second.clone()]
    check.take(99, [3e-2, 1e-3], 1.0)
    first.add_(3.0)
    second.add_(3.0)
    assert check.judge() is not None
    assert check.take_back() == ([99], True)
    assert torch.allclose(first, before[0] + 0.1, rtol=0, atol=1e-6)
    assert torch.allclose(second, before[1] + 3.0, rtol=0, atol=1e-6)


def test_steps_without_a_sign_are_measured_every_other_once_the_sizes_suffice() -> None:
    """The recent sizes fill from every step; then a step without a sign is measured only every
    `MEASURE_EVERY`-th (by number), while a step with a sign at any number is copied and judged."""
    check, weights, _ = _check()
    for step in range(1, HISTORY + 1):
        _step(check, weights, 1.0, lr=1e-3, grad_ratio=1.0, step=step)
    assert len(check.norms) == HISTORY
    for step in range(HISTORY + 1, HISTORY + 11):
        _step(check, weights, 1.0, lr=1e-3, grad_ratio=1.0, step=step)
    assert len(check.norms) == HISTORY + 10 // MEASURE_EVERY
    odd = next(n for n in range(HISTORY + 11, HISTORY + 11 + MEASURE_EVERY) if n % MEASURE_EVERY)
    assert _step(check, weights, 100.0, lr=1e-3 * LR_JUMP * 15, grad_ratio=1.0, step=odd) is not None
    assert check.copies == 1


def test_an_outsized_update_without_a_sign_stays_unjudged() -> None:
    check, weights, losses = _check()
    _steady(check, weights)
    assert _step(check, weights, 100.0, lr=1e-3, grad_ratio=1.0) is None
    assert check.copies == 0 and check.unjudged == 1 and losses == []  # nothing measured: no copy to compare


def test_an_lr_excursion_whose_updates_fit_their_own_batch_stays_while_the_rate_stays_up() -> None:
    """An outsized update at a jumped rate that lowered its own batch's loss opens an excursion: the
    weights of before it stay copied (no new copy at the same rate); a rate that stays up for
    `MAX_EXCURSION` steps is a new level: everything stays and the new rate is the kept one."""
    check, weights, losses = _check(raised=False)
    _steady(check, weights)
    high = 1e-3 * LR_JUMP * 15
    for step in range(1, MAX_EXCURSION + 1):
        assert _step(check, weights, 100.0, lr=high, grad_ratio=1.0, step=step) is None
    assert check.copies == 1 and len(losses) == 2  # copied and measured once, at the jump
    assert check.excursion is None and check.kept_lrs == [high]
    _step(check, weights, 100.0, lr=high, grad_ratio=1.0, step=MAX_EXCURSION + 1)
    assert check.copies == 1  # the new level gives no sign


def test_an_lr_burst_that_comes_back_down_is_taken_back_whole_at_the_kept_rate() -> None:
    """A burst (the rate up for three steps, then back, however it was set) whose updates lowered their own
    batches' losses: when the rate comes back and the batch of that step, which the burst never saw,
    does worse than at the weights of before the burst, all of it is taken back, that step included, and
    redone as four steps at the last kept rate would have made it (the update is linear in the rate)."""
    check, weights, _ = _check(raised=False)
    _steady(check, weights)
    before = weights.clone()
    for step in (1, 2, 3):
        assert _step(check, weights, 100.0, lr=1e-3 * LR_JUMP * 15, grad_ratio=1.0, step=step) is None
    check.raised = True  # the damage shows on the next batch
    why = _step(check, weights, 1.0, lr=1e-3, grad_ratio=1.0, step=4)
    assert why is not None and "came back down at step 4" in why and "from step 1" in why
    update = weights - before
    assert check.take_back() == ([1, 2, 3, 4], True)
    kept_share = 4 * 1e-3 / (3 * 1e-3 * LR_JUMP * 15 + 1e-3)  # four steps at the kept rate, of the rates run
    assert torch.allclose(weights, before + update * kept_share, rtol=0, atol=1e-6) and check.copies == 1


def test_an_open_excursion_lends_its_copy_from_before_the_jump() -> None:
    """While the rate is up, the copy of before the excursion's first step is a restore's source (the
    weights after step 0 here), swapped in and out bit for bit; once the rate is back down it is not."""
    check, weights, _ = _check(raised=False)
    _steady(check, weights)
    assert check.before_excursion() is None
    before = weights.clone()
    for step in (1, 2):
        _step(check, weights, 100.0, lr=1e-3 * LR_JUMP * 15, grad_ratio=1.0, step=step)
    copy = check.before_excursion()
    assert copy is not None and copy.step == 0 and copy.available() is None
    during = weights.clone()
    copy.swap([weights])
    assert torch.equal(weights, before)
    copy.swap([weights])
    assert torch.equal(weights, during)
    copy.restore([weights], None)
    assert torch.equal(weights, before)
    _step(check, weights, 1.0, lr=1e-3, grad_ratio=1.0, step=3)
    assert check.before_excursion() is None


def test_an_lr_burst_that_did_good_stays() -> None:
    """The same burst, but the batch of the step the rate came back at does better than before it."""
    check, weights, _ = _check(raised=False)
    _steady(check, weights)
    for step in (1, 2, 3):
        _step(check, weights, 100.0, lr=1e-3 * LR_JUMP * 15, grad_ratio=1.0, step=step)
    assert _step(check, weights, 1.0, lr=1e-3, grad_ratio=1.0, step=4) is None
    assert check.excursion is None and check.kept_lrs == [1e-3]


def test_an_optimizer_without_a_learning_rate_is_copied_every_step() -> None:
    check, weights, _ = _check()
    for _ in range(HISTORY + 3):
        check.take(0, [None], None)
        weights.add_(0.01)
        check.judge()
    assert check.copies == 3  # every step the check can judge


def test_the_state_keeps_what_the_signs_are_read_against() -> None:
    check, weights, _ = _check()
    _steady(check, weights)
    resumed, _, _ = _check()
    resumed.load_state_dict(check.state_dict())
    assert resumed.kept_lrs == check.kept_lrs and list(resumed.norms) == list(check.norms)
    resumed.take(0, [1e-3], 1.0)
    assert resumed.copies == 0  # an ordinary step after a resume gives no sign
