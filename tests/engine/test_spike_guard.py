"""The spike guard in a plain PyTorch loop: copies, trust, restore, cap, and a clean run left untouched."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from hf_hybrid.engine.spike_guard import SpikeGuard, SpikeGuardConfig
from hf_hybrid.engine.validation import ConfigError

STEPS = 120


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 8, generator=g)
    return x, x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(1024, 1, generator=g)


def _train(
    guard_config: SpikeGuardConfig | None, burst: range = range(0), on_restore: list[int] | None = None
) -> tuple[torch.nn.Module, SpikeGuard | None]:
    """A small MLP regression with AdamW at lr 1e-2; the learning rate x100 in the `burst` steps (1-based)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = None if guard_config is None else SpikeGuard(optimizer, guard_config)
    x, y = _data()
    for step in range(1, STEPS + 1):
        batch = torch.arange(step * 32, step * 32 + 32) % 512
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        grad_norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
        for group in optimizer.param_groups:
            group["lr"] = 1.0 if step in burst else 1e-2
        optimizer.step()
        restored = guard is not None and guard.after_step(step, float(loss.detach()), grad_norm, applied=True)
        if restored and on_restore is not None:
            on_restore.append(step)
    return model, guard


def _eval(model: torch.nn.Module) -> float:
    x, y = _data()
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x[512:]), y[512:]))


def test_clean_run_is_bit_identical_and_never_restores() -> None:
    plain, _ = _train(None)
    guarded, guard = _train(SpikeGuardConfig(every=10))
    assert guard is not None and guard.stats()["restores"] == 0
    for a, b in zip(plain.parameters(), guarded.parameters(), strict=True):
        assert torch.equal(a, b)
    # it holds two copies of the weights and Adam's two moments (and the step counters)
    weights = sum(p.numel() * 4 for p in plain.parameters())
    assert 3 * weights <= guard.stats()["spike_guard_bytes"] // 2 <= 3 * weights + 64


def test_lr_burst_is_restored_and_ends_near_the_clean_run() -> None:
    clean, _ = _train(None)
    faulted, _ = _train(None, burst=range(80, 83))
    restored_at: list[int] = []
    guarded, guard = _train(SpikeGuardConfig(every=10), burst=range(80, 83), on_restore=restored_at)
    assert guard is not None
    stats = guard.stats()
    assert stats["restores"] >= 1 and restored_at == stats["restore_steps"]
    assert all(81 <= s <= 84 for s in restored_at)
    assert stats["spike_skipped_steps"] >= len(restored_at)
    damage = _eval(faulted) - _eval(clean)
    assert damage > 0.1, "the burst must hurt the unguarded run for this test to mean anything"
    assert abs(_eval(guarded) - _eval(clean)) < 0.2 * damage


def test_restore_returns_weights_and_optimizer_state_of_the_trusted_copy() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    guard = SpikeGuard(optimizer, SpikeGuardConfig(every=2, trust_after=1))
    saved = {}
    for step in range(1, 25):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        guard.after_step(step, 1.0 + 0.01 * (step % 3), 1.0, applied=True)
        saved[step] = (copy.deepcopy(list(model.parameters())), copy.deepcopy(optimizer.state_dict()))
    trusted = guard.trusted.step
    assert trusted == 22  # copied at 22, trusted after one clean step; the copy at 24 is still pending
    assert guard.after_step(25, 50.0, 1.0, applied=True)
    weights, state = saved[trusted]
    for p, q in zip(model.parameters(), weights, strict=True):
        assert torch.equal(p, q)
    now = optimizer.state_dict()["state"]
    for index, entry in state["state"].items():
        for key, value in entry.items():
            assert torch.equal(now[index][key], value), key
    assert guard.stats()["spike_skipped_steps"] == 25 - trusted


def test_a_spike_right_after_a_copy_goes_back_to_the_copy_before_it() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = SpikeGuard(optimizer, SpikeGuardConfig(every=10, trust_after=3))
    weights = {}
    for step in range(1, 21):
        with torch.no_grad():
            model.weight.add_(1.0)
        weights[step] = model.weight.detach().clone()
        guard.after_step(step, 1.0 + 0.01 * (step % 2), 1.0, applied=True)
    assert guard.trusted.step == 10 and guard.pending.step == 20
    assert guard.after_step(21, 100.0, 1.0, applied=True)
    assert guard.stats()["spike_skipped_steps"] == 11
    assert torch.equal(model.weight, weights[10])
    assert guard.pending.step is None


def test_restores_are_capped_per_window(caplog: pytest.LogCaptureFixture) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = SpikeGuard(optimizer, SpikeGuardConfig(every=5, trust_after=1, max_restores=2, window=100))
    for step in range(1, 31):
        guard.after_step(step, 1.0 + 0.01 * (step % 2), 1.0, applied=True)
    with caplog.at_level(logging.WARNING, logger="hf_hybrid.engine.spike_guard"):
        restored = [guard.after_step(step, 100.0, 1.0, applied=True) for step in (31, 32, 33, 34)]
    assert restored == [True, True, False, False]
    assert sum("stops restoring" in r.message for r in caplog.records) == 1


def test_no_copy_no_restore_and_non_finite_steps_are_not_spikes() -> None:
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    guard = SpikeGuard(optimizer, SpikeGuardConfig(every=50))
    for step in range(1, 21):
        guard.after_step(step, 1.0 + 0.01 * (step % 2), 1.0, applied=True)
    assert not guard.after_step(21, 100.0, 1.0, applied=True)  # nothing trusted to go back to yet
    assert not guard.after_step(22, float("nan"), 1.0, applied=False)
    assert not guard.after_step(23, 1.0, float("inf"), applied=False)  # a GradScaler's own skip
    assert guard.stats()["restores"] == 0


def test_state_dict_round_trip_keeps_counters_statistics_and_copies() -> None:
    """A resumed guard restores what the uninterrupted one would: its copies travel with its state."""
    model, guard = _train(SpikeGuardConfig(every=10), burst=range(80, 83))
    assert guard is not None
    twin = copy.deepcopy(model)
    twin_optimizer = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    twin_optimizer.load_state_dict(guard.optimizer.state_dict())
    fresh = SpikeGuard(twin_optimizer, guard.config)
    fresh.load_state_dict(copy.deepcopy(guard.state_dict()))
    assert fresh.stats() == guard.stats() and fresh.stats()["restores"] >= 1
    assert fresh.detector.state_dict() == guard.detector.state_dict()
    assert fresh.trusted.step == guard.trusted.step is not None
    guard.restore(STEPS + 1, "test")
    fresh.restore(STEPS + 1, "test")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters(), strict=True))
    moments = [guard.optimizer.state[p]["exp_avg"] for p in model.parameters()]
    twins = [twin_optimizer.state[q]["exp_avg"] for q in twin.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(twins, moments, strict=True))


@pytest.mark.parametrize(
    ("field", "value"),
    [("every", 0), ("max_restores", -1), ("device", "gpu"), ("min_rise", float("nan")), ("min_history", 60)],
)
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"`{field}` must be"):
        SpikeGuardConfig(**{field: value})


def test_a_sudden_spike_skips_the_batch_and_a_second_one_blames_the_weights() -> None:
    from hf_hybrid.engine.spike_guard import BLAME_AFTER, MAX_SKIPS

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = SpikeGuard(optimizer, SpikeGuardConfig(every=5, trust_after=1))
    for step in range(1, 31):
        guard.after_step(step, 1.0 + 0.01 * (step % 2), 1.0, applied=True)
    assert guard.alarms(1.0, 1.0) == []
    for step in range(31, 31 + BLAME_AFTER):  # bad batches, skipped
        (alarm,) = guard.alarms(100.0, 1.0)
        assert alarm.skips_step and not alarm.restorable and not alarm.blames_weights
        guard.skipped(step)
    (second,) = guard.alarms(100.0, 1.0)  # the same weights kept spiking: they are to blame
    assert second.restorable and not second.skips_step
    assert not guard.alarms(100.0, 1.0, can_skip=False)[0].skips_step  # a GradScaler sees every step
    guard.restore(36, second.reason)
    for step in range(37, 37 + MAX_SKIPS):  # a trusted copy now: spikes are bad batches again
        (alarm,) = guard.alarms(100.0, 1.0)
        assert alarm.skips_step
        guard.skipped(step)
    assert guard.alarms(100.0, 1.0) == []  # the data changed: the run trains on
    stats = guard.stats()
    assert stats["skips"] == BLAME_AFTER + MAX_SKIPS and stats["restore_steps"] == [36]
    guard.observe(50, 1.0, 1.0, applied=True)
    assert guard.skips_in_a_row == 0 and not guard.restored_since_update


def _steady_guard(steps: int = 30) -> SpikeGuard:
    """A guard whose window holds `steps` losses of 1.0 +- 0.01, copies every 5 steps, trusted after 1."""
    model = torch.nn.Linear(2, 1)
    guard = SpikeGuard(torch.optim.SGD(model.parameters(), lr=0.1), SpikeGuardConfig(every=5, trust_after=1))
    for step in range(1, steps + 1):
        guard.after_step(step, 1.0 + 0.01 * (step % 2), 1.0, applied=True)
    return guard


def test_a_moderate_rise_counts_only_right_after_a_spike() -> None:
    """40% above the level is a heavy-tailed batch on its own (no alarm), but a spike's next step."""
    guard = _steady_guard()
    assert guard.alarms(1.4, 1.0) == []
    (first,) = guard.alarms(3.0, 1.0)
    assert first.skips_step
    guard.skipped(31)
    (second,) = guard.alarms(1.4, 1.0)
    assert second.skips_step


def test_a_restore_forgets_the_losses_of_the_steps_it_discarded() -> None:
    """The losses after the restored copy were the spike's: left in the window they would read as a
    lasting shift at the next steps and restore again and again."""
    guard = _steady_guard()
    assert guard.alarms(1.35, 1.0) == []  # under the one-step bar: applied
    guard.observe(31, 1.35, 1.0, applied=True)
    (lasting,) = guard.alarms(1.4, 1.0)  # two of the last three steps up: a lasting shift
    assert lasting.restorable and "last 3 steps" in lasting.reason
    trusted = guard.trusted.step
    guard.restore(32, lasting.reason)
    assert max(guard.detector.loss_steps) <= trusted and max(guard.detector.losses) < 1.1
    (after,) = guard.alarms(1.4, 1.0)  # the fault's next step: a bad batch now, not another restore
    assert after.skips_step and not after.restorable
    restored = SpikeGuard(guard.optimizer, guard.config)
    restored.load_state_dict(guard.state_dict())
    assert list(restored.detector.loss_steps) == list(guard.detector.loss_steps)
