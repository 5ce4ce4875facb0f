"""The spike guard: a loss spike in any step, predicted or not, is rolled back instead of trained through.

What large runs do by hand when the loss spikes (restart from a checkpoint before the spike, skip the
batches that caused it), done on the fly: every `every` applied real steps the trainable parameters and
the optimizer state are copied (to host memory by default). A copy is *pending* until `trust_after` clean
steps have followed it, then *trusted*: a spike is often seen a step after the update that caused it (a
learning-rate burst shows in the next batch's loss), so only a copy with clean steps after it is a state
to go back to. When a real step's loss or gradient norm is a spike against the recent steps
(`SpikeDetector`), the trusted copy is restored, weights and optimizer state; the batches since it
are skipped (the data loader moves on, the learning-rate schedule follows the step count as it always
does). At most `max_restores` restores in any `window` steps: after that it says so and lets the run
train as the plain loop would, until the window has passed.

Non-finite steps are not spikes here: they are never applied (or a GradScaler skips them itself).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch

from .alarm import Alarm, DivergenceLevel
from .config import SPIKE_GUARD_OFF, SpikeGuardConfig
from .sharding import local

logger = logging.getLogger(__name__)

__all__ = ["SPIKE_GUARD_OFF", "SpikeDetector", "SpikeGuard", "SpikeGuardConfig"]

SPIKE = "loss spike"  # how a spike alarm's reason starts
LEVEL_STEPS = 5  # the loss's current level: the median of this many recent clean steps
# A lasting shift: the median of the last SHIFT_STEPS losses SHIFT_Z noise units and SHIFT_RISE of the
# level above the median of the SHIFT_BASE steps before them. Two of three steps that far out by chance
# is rare (~5e-6 a step for Gaussian noise); an lr x30 burst on the 2x64 GPT-2 raised the loss by 4
# noise units and 19% for six steps without any single step passing the one-step test.
SHIFT_STEPS, SHIFT_BASE, SHIFT_Z, SHIFT_RISE = 3, 20, 3.0, 0.1
# Sudden spikes in a row skipped as bad batches before the weights are blamed: waiting costs a step each,
# a restore about `every` / 2 + `trust_after`, so waiting about as long bounds the cost of a wrong guess.
BLAME_AFTER = 5
MAX_SKIPS = 8  # sudden spikes in a row skipped as bad batches after a restore; then the run trains on


def _spike_alarm(why: str, **kind: bool) -> Alarm:
    return Alarm(DivergenceLevel.CRITICAL, f"{SPIKE}: {why}", **kind)


class _Copy:
    """Parameters and optimizer state at one step, in buffers reused from copy to copy."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.params: list[torch.Tensor] = []
        self.state: list[dict[str, Any]] = []

    def state_dict(self) -> dict[str, Any]:
        """The copy itself (tensors go to the checkpoint's tensor file); values a checkpoint cannot hold
        (an optimizer's own objects) are left out, and the copy with them: it is taken again."""
        if self.step is None or not all(_storable(v) for s in self.state for v in s.values()):
            return {"step": None}
        return {"step": self.step, "params": list(self.params), "state": [dict(s) for s in self.state]}

    def load_state_dict(self, saved: dict[str, Any], params: list[torch.Tensor], device: str) -> None:
        self.step = None if saved["step"] is None else int(saved["step"])
        if self.step is None:
            self.params, self.state = [], []
            return
        where = [torch.device("cpu") if device == "cpu" else local(p).device for p in params]
        self.params = [t.to(w) for t, w in zip(saved["params"], where, strict=True)]
        self.state = [
            {k: v.to(w) if torch.is_tensor(v) else v for k, v in s.items()}
            for s, w in zip(saved["state"], where, strict=True)
        ]

    def take(self, step: int, params: list[torch.Tensor], optimizer: Any, device: str) -> None:
        self.step = step
        self.params = [_copy_into(old, p, device) for old, p in _pad(self.params, params)]
        states = [optimizer.state.get(p, {}) for p in params]
        olds = _pad(self.state, states)
        self.state = [
            {
                k: _copy_into(old.get(k), v, device) if torch.is_tensor(v) else _plain(v)
                for k, v in state.items()
            }
            for old, state in ((o or {}, s) for o, s in olds)
        ]

    @torch.no_grad()
    def restore(self, params: list[torch.Tensor], optimizer: Any) -> None:
        for buf, p in zip(self.params, params, strict=True):
            local(p).copy_(buf)
        for saved, p in zip(self.state, params, strict=True):
            live = optimizer.state.get(p)
            if not saved:
                optimizer.state.pop(p, None)
                continue
            if live is None:
                live = optimizer.state[p] = {}
            for key, value in saved.items():
                now = live.get(key)
                if torch.is_tensor(value) and torch.is_tensor(now) and local(now).shape == value.shape:
                    local(now).copy_(value)
                elif torch.is_tensor(value):
                    live[key] = value.to(p.device, copy=True)
                else:
                    live[key] = _plain(value)
            for key in set(live) - set(saved):
                del live[key]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.params
        for state in self.state:
            yield from (v for v in state.values() if torch.is_tensor(v))


def _storable(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return all(_storable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _storable(v) for k, v in value.items())
    return value is None or isinstance(value, torch.Tensor | bool | int | float | str)


def _pad(old: list[Any], new: list[Any]) -> list[tuple[Any, Any]]:
    return [(old[i] if i < len(old) else None, item) for i, item in enumerate(new)]


def _plain(value: Any) -> Any:
    """A non-tensor state value (Adam's `step` in some optimizers, a flag): copied shallowly."""
    return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value


def _copy_into(buf: torch.Tensor | None, tensor: torch.Tensor, device: str) -> torch.Tensor:
    src = local(tensor).detach()
    target = torch.device("cpu") if device == "cpu" else src.device
    if buf is None or buf.shape != src.shape or buf.dtype != src.dtype or buf.device != target:
        pin = target.type == "cpu" and src.device.type == "cuda"
        buf = torch.empty(src.shape, dtype=src.dtype, device=target, pin_memory=pin)
    buf.copy_(src, non_blocking=buf.is_pinned())
    return buf


class SpikeDetector:
    """Is a step's loss or gradient norm a spike against the recent clean steps (see the config)?"""

    def __init__(self, config: SpikeGuardConfig) -> None:
        self.config = config
        self.losses: deque[float] = deque(maxlen=config.history)
        self.loss_steps: deque[int] = deque(maxlen=config.history)  # the step of each loss
        self.grad_norms: deque[float] = deque(maxlen=config.history)

    def spike(self, loss: float | None, grad_norm: float | None, after_spike: bool = False) -> str | None:
        """Why this step is a spike (sudden or lasting), or None."""
        return self.sudden(loss, grad_norm, after_spike) or self.lasting(loss)

    def sudden(self, loss: float | None, grad_norm: float | None, after_spike: bool = False) -> str | None:
        """One step far out: its loss against the median of the last few steps, in units of the
        step-to-step noise (the robust spread of successive differences, which a falling trend does not
        inflate as it does the spread of the values themselves), or its gradient norm. `after_spike`: the
        step before was one, so a smaller rise counts (`min_rise_after_spike`)."""
        c = self.config
        if loss is not None and len(self.losses) >= c.min_history:
            level, noise = self._level_and_noise()
            z = (loss - level) / noise
            rise = c.min_rise_after_spike if after_spike else c.min_rise
            if z > c.max_z and loss > level + rise * abs(level):
                return f"loss {loss:.4g} is {z:.0f} noise units above the recent {level:.4g}"
        if grad_norm is not None and len(self.grad_norms) >= c.min_history:
            median = max(statistics.median(self.grad_norms), 1e-12)
            if grad_norm > c.max_grad_ratio * median:
                return f"gradient norm {grad_norm:.4g} is {grad_norm / median:.0f}x the recent median"
        return None

    def lasting(self, loss: float | None) -> str | None:
        """A shift that lasts (weights damaged by a burst of large updates): the last few steps' median
        against the level before them."""
        if loss is None or len(self.losses) < self.config.min_history:
            return None
        recent = list(self.losses)
        _, noise = self._level_and_noise()
        before = statistics.median(recent[-SHIFT_BASE - SHIFT_STEPS + 1 : -SHIFT_STEPS + 1])
        now = statistics.median([*recent[-SHIFT_STEPS + 1 :], loss])
        shift = (now - before) / noise
        if shift > SHIFT_Z and now > before + SHIFT_RISE * abs(before):
            return (
                f"the loss of the last {SHIFT_STEPS} steps, {now:.4g}, is {shift:.1f} noise units above "
                f"the {before:.4g} before them"
            )
        return None

    def _level_and_noise(self) -> tuple[float, float]:
        recent = list(self.losses)
        level = statistics.median(recent[-LEVEL_STEPS:])
        jumps = [abs(b - a) for a, b in zip(recent[:-1], recent[1:], strict=True)]
        return level, max(1.4826 * statistics.median(jumps) / math.sqrt(2), 1e-3 * abs(level), 1e-12)

    def add(self, loss: float | None, grad_norm: float | None, step: int = 0) -> None:
        if loss is not None:
            self.losses.append(loss)
            self.loss_steps.append(step)
        if grad_norm is not None:
            self.grad_norms.append(grad_norm)

    def forget_after(self, step: int) -> None:
        """The losses of the steps after `step` belong to a trajectory that was restored away: a spike
        left in the window would make the next steps look like a lasting shift again."""
        while self.loss_steps and self.loss_steps[-1] > step:
            self.losses.pop()
            self.loss_steps.pop()

    def state_dict(self) -> dict[str, Any]:
        return {
            "losses": list(self.losses),
            "loss_steps": list(self.loss_steps),
            "grad_norms": list(self.grad_norms),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.losses = deque((float(v) for v in state["losses"]), maxlen=self.config.history)
        steps = state.get("loss_steps", [0] * len(self.losses))  # a checkpoint from before the steps
        self.loss_steps = deque((int(s) for s in steps), maxlen=self.config.history)
        self.grad_norms = deque((float(v) for v in state["grad_norms"]), maxlen=self.config.history)


class SpikeGuard:
    """Copies the training state every `config.every` clean steps; restores the trusted copy on a spike.

    `after_step(step, loss, grad_norm, applied)` is called after every optimizer step with what it
    measured; it returns True when it restored (the caller's other state derived from the weights is then
    stale). Every rank must pass the same loss and grad norm (the averaged ones), so all decide alike.
    """

    def __init__(self, optimizer: Any, config: SpikeGuardConfig | None = None) -> None:
        """`config.enabled=False` (or no optimizer): a guard that judges nothing and holds nothing, so its
        owner need not ask whether there is one."""
        self.config = config or SpikeGuardConfig()
        self.optimizer = optimizer
        groups = [] if optimizer is None or not self.config.enabled else optimizer.param_groups
        self.params = [p for group in groups for p in group["params"] if p.requires_grad]
        self.detector = SpikeDetector(self.config)
        self.trusted, self.pending = _Copy(), _Copy()
        self.clean_since_pending = 0
        self.restore_steps: list[int] = []
        self.skip_steps: list[int] = []
        self.skips_in_a_row = 0
        self.restored_since_update = False  # the weights are a trusted copy: spikes are the batches'
        self.skipped_steps = 0
        self.capped_at: int | None = None  # the step of the last refusal, logged once per window

    def after_step(self, step: int, loss: float | None, grad_norm: float | None, applied: bool) -> bool:
        """A plain loop's one call after each optimizer step: judge it, restore (True) or copy as due.
        (The engine calls the parts itself, so that a restore goes through its recovery rule.)"""
        why = self.check(loss, grad_norm)
        why = None if why is None else f"{SPIKE}: {why}"
        if why is not None and self.can_restore(step, why):
            self.restore(step, why)
            return True
        self.observe(step, loss, grad_norm, applied)
        return False

    def check(self, loss: float | None, grad_norm: float | None) -> str | None:
        """Why this step is a spike, or None (non-finite steps never are: they are not applied)."""
        if not self.params or not self._finite(loss, grad_norm):
            return None
        return self.detector.spike(loss, grad_norm)

    def alarms(self, loss: float | None, grad_norm: float | None, can_skip: bool = True) -> list[Alarm]:
        """The spike as the engine's recovery rule takes it, judged before the step's update is applied.

        A sudden spike first blames the batch: the step is skipped (its update never applied, nothing
        to restore). `BLAME_AFTER` of them in a row blame the weights (the same weights kept spiking): the
        recovery rule may `restore`, as it may for a lasting shift. Right after a restore the weights are
        a trusted copy, so sudden spikes are bad batches again, skipped up to `MAX_SKIPS` in a row; past
        that the data has changed and the run trains on. `can_skip=False` where the optimizer must see
        every step (a fp16 GradScaler)."""
        if not self.params or not self._finite(loss, grad_norm):
            return []
        lasting = self.detector.lasting(loss)
        sudden = None if lasting else self.detector.sudden(loss, grad_norm, self._after_spike)
        if (
            sudden is not None
            and can_skip
            and (self.skips_in_a_row < BLAME_AFTER or self.restored_since_update)
        ):
            if self.skips_in_a_row >= MAX_SKIPS:
                return []
            return [_spike_alarm(sudden, blames_weights=False, skips_step=True)]
        why = lasting or sudden
        return [] if why is None else [_spike_alarm(why, restorable=True)]

    @property
    def _after_spike(self) -> bool:
        """The step before was skipped or restored as a spike: a smaller rise counts as one too."""
        return self.skips_in_a_row > 0 or self.restored_since_update

    def skipped(self, step: int) -> None:
        """The engine did not apply this step's update (`alarms` blamed the batch)."""
        self.skips_in_a_row += 1
        self.skip_steps.append(step)
        self.skipped_steps += 1

    def observe(self, step: int, loss: float | None, grad_norm: float | None, applied: bool) -> None:
        """A step that was not restored: its values join the recent window (a spike left alone is the new
        normal, learnt as such); a clean applied step earns trust for the pending copy or takes one."""
        if not self.params or not self._finite(loss, grad_norm):
            return
        spike = self.detector.spike(loss, grad_norm, self._after_spike) is not None
        self.detector.add(loss, grad_norm, step)
        if applied:
            self.skips_in_a_row, self.restored_since_update = 0, False
        if applied and not spike:
            self._advance(step)

    def can_restore(self, step: int, why: str) -> bool:
        """A trusted copy exists and the window's cap is not reached (each refusal is said once)."""
        if self.trusted.step is None:
            logger.warning("hf_hybrid: step %d: %s; no trusted copy yet, carried on", step, why)
            return False
        recent = [s for s in self.restore_steps if s > step - self.config.window]
        if len(recent) < self.config.max_restores:
            return True
        if self.capped_at is None or self.capped_at <= step - self.config.window:
            logger.warning(
                "hf_hybrid: step %d: %s, but %d restores in the last %d steps already: the "
                "spike guard stops restoring until the window has passed",
                step,
                why,
                len(recent),
                self.config.window,
            )
            self.capped_at = step
        return False

    def restore(self, step: int, why: str) -> None:
        """Put back the trusted copy's weights and optimizer state; the batches since it are skipped."""
        self.trusted.restore(self.params, self.optimizer)
        self.detector.forget_after(self.trusted.step)
        skipped = step - self.trusted.step
        self.skipped_steps += skipped
        self.restore_steps.append(step)
        self.pending.step, self.clean_since_pending, self.skips_in_a_row = None, 0, 0
        self.restored_since_update = True
        logger.warning(
            "hf_hybrid: step %d: %s -> restored the weights and optimizer state of step %d, "
            "skipping the %d batches since",
            step,
            why,
            self.trusted.step,
            skipped,
        )
        self.trusted.step = step  # the state is now that copy's, at this step: skip from here next time

    def _advance(self, step: int) -> None:
        """A clean applied step: a pending copy earns trust; a copy is due every `every` steps."""
        if self.pending.step is not None:
            self.clean_since_pending += 1
            if self.clean_since_pending >= self.config.trust_after:
                self.trusted, self.pending = self.pending, self.trusted
                self.pending.step = None
        if step % self.config.every == 0 and self.pending.step is None:
            self.pending.take(step, self.params, self.optimizer, self.config.device)
            self.clean_since_pending = 0

    @staticmethod
    def _finite(loss: float | None, grad_norm: float | None) -> bool:
        values = [v for v in (loss, grad_norm) if v is not None]
        return bool(values) and all(math.isfinite(v) for v in values)

    # ---- what it holds and did --------------------------------------------------------------------

    def tensors(self) -> list[torch.Tensor]:
        """The copies' buffers (both kept: the trusted one and the next, pending or reused)."""
        return [*self.trusted.tensors(), *self.pending.tensors()]

    def nbytes(self) -> int:
        return self.trusted.nbytes() + self.pending.nbytes()

    def buffer_count(self) -> int:
        """How many parameter buffers the copies hold (changes when a copy is first taken)."""
        return len(self.trusted.params) + len(self.pending.params)

    def stats(self) -> dict[str, Any]:
        if not self.params:
            return dict(SPIKE_GUARD_OFF)
        return {
            "spike_guard": True,
            "restores": len(self.restore_steps),
            "spike_skipped_steps": self.skipped_steps,
            "restore_steps": list(self.restore_steps),
            "skips": len(self.skip_steps),
            "spike_guard_bytes": self.nbytes(),
        }

    def state_dict(self) -> dict[str, Any]:
        """Counters, the detector's window and both copies, so a resumed run restores what the
        uninterrupted one would (a full fine-tune's checkpoint holds two more copies of the weights and
        the optimizer state; an adapter's, two of the adapters')."""
        return {
            "detector": self.detector.state_dict(),
            "trusted": self.trusted.state_dict(),
            "pending": self.pending.state_dict(),
            "clean_since_pending": self.clean_since_pending,
            "restore_steps": list(self.restore_steps),
            "skip_steps": list(self.skip_steps),
            "skips_in_a_row": self.skips_in_a_row,
            "restored_since_update": self.restored_since_update,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.detector.load_state_dict(state["detector"])
        self.restore_steps = [int(s) for s in state["restore_steps"]]
        self.skip_steps = [int(s) for s in state.get("skip_steps", [])]
        self.skips_in_a_row = int(state.get("skips_in_a_row", 0))
        self.restored_since_update = bool(state.get("restored_since_update", False))
        self.skipped_steps = int(state["skipped_steps"])
        self.clean_since_pending = int(state.get("clean_since_pending", 0))
        for name in ("trusted", "pending"):
            if name in state:
                getattr(self, name).load_state_dict(state[name], self.params, self.config.device)
