"""The spike guard: a loss spike in a real step is blamed on the batch or on the weights before anything
is done about it, and only what is to blame is undone.

What large runs do by hand when the loss spikes (skip the batches that caused it, or go back to a state
before it), done on the fly and through the engine's one recovery rule (`recovery.py`):

- every `every` clean applied steps a copy of the trainable weights and the optimizer state is taken
  (`CopyStore`: in host memory, weights only, or the last checkpoint the caller saved). A copy is
  *pending* until `trust_after` clean steps have followed it, then *trusted*: a spike is often seen a
  step after the update that caused it, so only a copy with clean steps after it is a state to go
  back to;
- `SpikeDetector` says whether a step's loss (or gradient norm) is a sudden spike or part of a lasting
  shift against the recent clean steps;
- when it fires, the guard *blames* before acting: the step's batch is measured again at the
  trusted weights (`suspect_loss`, a no-grad forward the caller provides). Bad data is bad at the
  trusted weights too: the step is skipped (`RecoveryAction.SKIP`), the weights kept; a batch not
  grossly bad (`GROSS_RISE`) only from the second firing step in a row, as one hard batch is left
  alone (clean runs have them). A batch that is
  fine at the trusted weights blames the weights, and the guard is patient: a shift that comes back by
  itself within `patience` firing steps is left alone (as the plain run recovers from it); one that
  does not is undone (`RecoveryAction.RESTORE`: the trusted copy put back, the batches since skipped).

An update can also do damage the loss does not show above its batch noise: where it is cheap, every
step's applied update is checked too (`UpdateCheck`: one many times the recent ones that raised its own
batch's loss is taken back, `RecoveryAction.SKIP` after the fact).

At most `max_restores` restores in any `window` steps: after that it says so and lets the run train as
the plain loop would. Non-finite steps are not spikes here: the recovery rule never applies them.
Numbers and how they were chosen: `benchmarks/README.md`, "The spike guard".
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from .alarm import Alarm, DivergenceLevel
from .config import SpikeGuardConfig
from .sharding import local
from .timing import clock_for, largest_over_ranks
from .update_check import UpdateCheck

logger = logging.getLogger(__name__)

__all__ = [
    "CopyStore",
    "HostCopy",
    "NoCopy",
    "SpikeDetector",
    "SpikeGuard",
    "SpikeGuardConfig",
]

SPIKE = "loss spike"  # how a spike alarm's reason starts
LEVEL_STEPS = 5  # the loss's current level: the median of this many recent clean steps
# A lasting shift: the median of the last SHIFT_STEPS losses SHIFT_Z noise units and SHIFT_RISE of the
# level above the median of the SHIFT_BASE steps before them. Two of three steps that far out by chance
# is rare (~5e-6 a step for Gaussian noise); an lr x30 burst on the 2x64 GPT-2 raised the loss by 4
# noise units and 19% for six steps without any single step passing the one-step test.
SHIFT_STEPS, SHIFT_BASE, SHIFT_Z, SHIFT_RISE = 3, 20, 3.0, 0.1
# The batch is blamed when its loss at the trusted weights is within this share of the rise of the loss
# now: bad data is (about) as bad at the trusted weights; damaged weights are not.
BLAME_SHARE = 0.5
# Without a way to measure the step's batch again (`suspect_loss`), sudden spikes in a row skipped as
# bad batches before the weights are blamed.
BLAME_AFTER = 5
MAX_SKIPS = 8  # spikes in a row skipped as bad batches; after that the data has changed: the run trains on
# A batch blamed on the data is skipped at its first firing step only when its loss is over (1 + this)
# times the level: random tokens on the GPT-2 tasks (2.5-3.7x), both faults on MiniLM full fine-tune.
# A smaller spike is left alone once and skipped from its second firing step in a row (a run of bad
# batches), as a clean run's hard batch comes alone: the largest clean one recorded rose 67% (MiniLM-LoRA
# at x2 the tuned rate, seed 2), and skipping it cost 0.005 of eval loss.
GROSS_RISE = 1.0
MAX_SPACING = 16  # the copies' spacing grows to at most this many times `every` (`max_copy_share`)
DATA, WEIGHTS = "data", "weights"


def _spike_alarm(why: str, **kind: bool) -> Alarm:
    return Alarm(DivergenceLevel.CRITICAL, f"{SPIKE}: {why}", spike=True, **kind)


class CopyStore(Protocol):
    """Where a copy of the training state lives. `step` is None while it holds nothing; `periodic`: the
    guard takes one every `every` clean steps (else only at the caller's checkpoints, `rebase`);
    `persistent`: it outlives the process (a checkpoint on disk), so a resumed run has it too."""

    step: int | None
    periodic: bool
    persistent: bool

    def take(self, step: int, params: list[torch.Tensor], optimizer: Any) -> None: ...

    def clear(self) -> None:
        """Hold nothing (and free what was held)."""

    def restore(self, params: list[torch.Tensor], optimizer: Any) -> None: ...

    def available(self) -> str | None:
        """Why the copy cannot be restored now (None: it can)."""

    def swap(self, params: list[torch.Tensor]) -> bool:
        """Exchange the copy's weights with the live ones (twice restores both); False if it cannot."""

    def nbytes(self) -> int: ...

    def tensors(self) -> Iterator[torch.Tensor]: ...


class HostCopy:
    """Parameters (and, unless `weights_only`, the optimizer state) at one step, in buffers reused from
    copy to copy, on `device` ("cpu": host memory, pinned under CUDA; "same": the parameters' device).
    A weights-only copy restores the weights and resets the optimizer's state for them (Adam starts its
    moments again), at a third of the memory with Adam."""

    periodic, persistent = True, False

    def __init__(self, device: str = "cpu", weights_only: bool = False) -> None:
        self.device = device
        self.weights_only = weights_only
        self.step: int | None = None
        self.params: list[torch.Tensor] = []
        self.state: list[dict[str, Any]] = []

    def take(self, step: int, params: list[torch.Tensor], optimizer: Any) -> None:
        self.step = step
        self.params = [_copy_into(old, p, self.device) for old, p in _pad(self.params, params)]
        if self.weights_only:
            return
        states = [optimizer.state.get(p, {}) for p in params]
        self.state = [
            {
                k: _copy_into(old.get(k), v, self.device) if torch.is_tensor(v) else _plain(v)
                for k, v in state.items()
            }
            for old, state in ((o or {}, s) for o, s in _pad(self.state, states))
        ]

    def clear(self) -> None:
        self.step, self.params, self.state = None, [], []

    def available(self) -> str | None:
        return None if self.step is not None else "no copy"

    @torch.no_grad()
    def restore(self, params: list[torch.Tensor], optimizer: Any) -> None:
        for buf, p in zip(self.params, params, strict=True):
            local(p).copy_(buf)
        if self.weights_only:
            for p in params:
                optimizer.state.pop(p, None)
            return
        for saved, p in zip(self.state, params, strict=True):
            _restore_state(optimizer, p, saved)

    @torch.no_grad()
    def swap(self, params: list[torch.Tensor]) -> bool:
        for buf, p in zip(self.params, params, strict=True):
            live = local(p).detach().clone()
            local(p).copy_(buf)
            buf.copy_(live)
        return True

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.params
        for state in self.state:
            yield from (v for v in state.values() if torch.is_tensor(v))


class NoCopy:
    """`storage="none"`: no copy is kept; the guard only skips bad batches."""

    periodic, persistent = False, False

    def __init__(self) -> None:
        self.step: int | None = None

    def take(self, step: int, params: list[torch.Tensor], optimizer: Any) -> None:
        """Nothing is kept."""

    def clear(self) -> None:
        self.step = None

    def restore(self, params: list[torch.Tensor], optimizer: Any) -> None:
        raise RuntimeError("a spike guard without copies cannot restore")

    def available(self) -> str | None:
        return "no copy is kept (hybrid_guard_storage=none)"

    def swap(self, params: list[torch.Tensor]) -> bool:
        return False

    def nbytes(self) -> int:
        return 0

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from ()


def host_copies(config: SpikeGuardConfig) -> tuple[CopyStore, CopyStore]:
    """The two stores `config.storage` asks for, when the guard keeps them itself (not `checkpoint`)."""
    if config.storage in ("host", "weights"):
        weights_only = config.storage == "weights"
        return HostCopy(config.device, weights_only), HostCopy(config.device, weights_only)
    if config.storage == "none":
        return NoCopy(), NoCopy()
    raise ValueError(f"storage {config.storage!r} needs its copies from the caller (`copies=`)")


def _restore_state(optimizer: Any, p: torch.Tensor, saved: dict[str, Any]) -> None:
    """The optimizer's state for `p` made equal to `saved` (tensors copied in place where they fit)."""
    if not saved:
        optimizer.state.pop(p, None)
        return
    live = optimizer.state.get(p)
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

    def elevated(self, loss: float) -> bool:
        """This step's own loss is as far above the level before the recent steps as a lasting shift
        is: when it is not, a shift that `lasting` still sees in the recent median is coming back."""
        recent = list(self.losses)
        if len(recent) < self.config.min_history:
            return False
        _, noise = self._level_and_noise()
        before = statistics.median(recent[-SHIFT_BASE - SHIFT_STEPS + 1 : -SHIFT_STEPS + 1])
        return (loss - before) / noise > SHIFT_Z and loss > before + SHIFT_RISE * abs(before)

    def level(self) -> float:
        """The loss's current level (the median of the last few steps in the window)."""
        return statistics.median(list(self.losses)[-LEVEL_STEPS:])

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
    """Judges every real step's loss before its update is applied; skips the bad batches, restores the
    trusted copy when the weights are to blame and do not come back by themselves.

    The engine calls, per real step outside a predict phase: `alarms` (before the update; what the
    recovery rule acts on), then `skipped`, `restore` or `observe` as the rule decided, and `rebase`
    when the caller saves a checkpoint. Every rank must pass the same loss and grad norm (the averaged
    ones), and `suspect_loss` must be the same on every rank, so all decide alike.
    """

    def __init__(
        self,
        optimizer: Any,
        config: SpikeGuardConfig | None = None,
        *,
        suspect_loss: Callable[[], float | None] | None = None,
        copies: tuple[CopyStore, CopyStore] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """`config.enabled=False` (or no optimizer): a guard that judges nothing and holds nothing, so its
        owner need not ask whether there is one. `suspect_loss()`: the loss of this step's batches at
        the live weights, measured again without a gradient (None: it cannot be); the guard calls it with
        the trusted weights swapped in, to blame. `copies`: the two stores the guard alternates
        between (default: host copies per `config.storage`). `clock`: what the first copy and the steps
        before it are timed with to space the copies (default: the engine's, `timing.clock_for`)."""
        self.config = config or SpikeGuardConfig()
        self.optimizer = optimizer
        groups = [] if optimizer is None or not self.config.enabled else optimizer.param_groups
        self.params = [p for group in groups for p in group["params"] if p.requires_grad]
        self.suspect_loss = suspect_loss
        self.detector = SpikeDetector(self.config)
        self.trusted, self.pending = copies or host_copies(self.config)
        self.clean_since_pending = 0
        self.clock = clock or clock_for(self.params)
        self.copy_every: int | None = None if self.config.max_copy_share > 0 else self.config.every
        self.step_times: list[float] = []  # seconds of consecutive applied steps, until the spacing is set
        self.last_observed: tuple[int, float] | None = None
        self.restore_steps: list[int] = []
        self.skip_steps: list[int] = []
        self.skips_in_a_row = 0
        self.restored_since_update = False  # the weights are a trusted copy: spikes are the batches'
        self.skipped_steps = 0
        self.suspect_since: int | None = None  # the first step a spike blamed the weights, not yet undone
        self.suspect_level = 0.0  # the loss's level then
        self.suspect_hits = 0  # steps that fired since, blamed on the weights
        self.quiet_steps = 0  # steps in a row since the last firing while suspect
        self.blames = {DATA: 0, WEIGHTS: 0}
        self.fired = False  # whether the detector fired at the step `alarms` judged last
        self.fired_at: int | None = None  # the last step it fired at
        self.capped_at: int | None = None  # the step of the last refusal, logged once per window
        self.update_check = UpdateCheck(
            self.params,
            max_ratio=self.config.max_update_ratio if self.config.storage == "host" else 0.0,
            history=self.config.history,
            min_history=self.config.min_history,
            suspect_loss=suspect_loss,
            device=self.config.device,
        )
        self.taken_back_steps: list[int] = []
        self.step_grad_norm: float | None = None

    @classmethod
    def off(cls) -> SpikeGuard:
        """A guard that judges nothing and holds nothing (what an engine without one has)."""
        return cls(None, SpikeGuardConfig(enabled=False))

    # ---- the engine's calls, in step order ----------------------------------------------------------

    def alarms(
        self, step: int, loss: float | None, grad_norm: float | None, can_skip: bool = True
    ) -> list[Alarm]:
        """The spike as the recovery rule takes it, judged before the step's update is applied.

        A detector firing is blamed first (`blame`, once per suspicion: each measurement is a forward
        pass): the data's fault skips the step (its update never applied; nothing to restore) when the
        batch is grossly bad or the step before fired too, up to `MAX_SKIPS` in a row, after which the
        data has changed and the run trains on. The weights' fault
        waits `patience` firing steps for the loss to come back by itself, then asks for a restore.
        `can_skip=False` where the optimizer must see every step (a fp16 GradScaler): a spike can only
        be restored there."""
        self.step_grad_norm = grad_norm  # a sign the update check reads before the update
        if not self.params or not _finite(loss, grad_norm):
            return []
        lasting = self.detector.lasting(loss)
        if lasting and not self.detector.elevated(loss):
            lasting = None  # the recent median is still up, but this step is back: coming back
        sudden = None if lasting else self.detector.sudden(loss, grad_norm, self._after_spike)
        why = lasting or sudden
        self.fired = why is not None
        in_a_row = self.fired_at == step - 1
        if self.fired:
            self.fired_at = step
        if why is None:
            self._quiet(step)
            return []
        self.quiet_steps = 0
        # blamed already: this step counts against the weights
        culprit = WEIGHTS if self.suspect_since is not None else self.blame(loss, sudden is not None)
        self.blames[culprit] += 1
        # the data's fault: a gross spike's batch is skipped at once, any other from its second firing step
        # in a row (a run of bad batches; one hard batch is left alone, as clean runs have them)
        if culprit == DATA:
            if (in_a_row or (sudden and self._gross(loss))) and can_skip and self.skips_in_a_row < MAX_SKIPS:
                return [_spike_alarm(f"{why}; the batch is to blame", blames_weights=False, skips_step=True)]
            return []
        self.suspect_hits += 1
        if self.suspect_since is None:
            self.suspect_since, self.suspect_level = step, self.detector.level()
        if self.suspect_hits < self.config.patience:
            logger.info(
                "hf_hybrid: step %d: %s; the weights are to blame: waiting (%d of %d firing steps) for the "
                "loss to come back by itself",
                step,
                f"{SPIKE}: {why}",
                self.suspect_hits,
                self.config.patience,
            )
            return []
        return [
            _spike_alarm(f"{why}; the weights are to blame since step {self.suspect_since}", restorable=True)
        ]

    def blame(self, loss: float, sudden: bool) -> str:
        """`DATA` or `WEIGHTS`: is this step's batch as bad at the trusted weights (the data's fault) or
        not (the weights')? One forward pass, of this step's batch only (for a lasting shift too: three
        batches cost 0.9% of a clean MiniLM-LoRA run's step time where the detector fired once).
        Without a way to measure it (no `suspect_loss`, no trusted copy in memory), a sudden spike is the
        batch's until `BLAME_AFTER` of them in a row and a lasting shift is the weights'. Right after a
        restore the weights are the trusted copy: the batch is to blame."""
        if self.restored_since_update:
            return DATA
        measured = self._loss_at_trusted()
        if measured is None:
            return DATA if sudden and self.skips_in_a_row < BLAME_AFTER else WEIGHTS
        # while the weights are suspect the window has learnt the raised losses: the rise is from before
        level = self.detector.level() if self.suspect_since is None else self.suspect_level
        return WEIGHTS if loss - measured > BLAME_SHARE * (loss - level) else DATA

    def _loss_at_trusted(self) -> float | None:
        """This step's batch's loss with the trusted weights swapped in (then swapped back, bit-exact)."""
        if self.suspect_loss is None or self.trusted.available() is not None:
            return None
        if not self.trusted.swap(self.params):
            return None
        try:
            measured = self.suspect_loss()
        finally:
            self.trusted.swap(self.params)
        return measured if measured is not None and math.isfinite(measured) else None

    def before_update(self, step: int) -> None:
        """The optimizer is about to apply this step's update: the update check keeps what it changes (the
        whole weights where this step's learning rates or gradient norm show a sign of an outsized one)."""
        if not self.update_check.on:
            return
        lrs = [None if g.get("lr") is None else float(g["lr"]) for g in self.optimizer.param_groups]
        grads, grad_norm = self.detector.grad_norms, self.step_grad_norm
        grad_ratio = (
            grad_norm / max(statistics.median(grads), 1e-12)
            if grad_norm is not None and len(grads) >= self.config.min_history
            else None
        )  # against the detector's window of the applied steps' gradient norms
        self.update_check.take(step, lrs, grad_ratio)

    def update_alarms(self, step: int) -> list[Alarm]:
        """The update the optimizer just applied, judged (`UpdateCheck`): an alarm that takes it back, or
        none. Past `MAX_SKIPS` skips in a row it stays, as a spike does."""
        why = self.update_check.judge(can_take_back=self.skips_in_a_row < MAX_SKIPS)
        if why is None:
            return []
        why = f"outsized update: {why}"
        return [Alarm(DivergenceLevel.CRITICAL, why, spike=True, skips_step=True, takes_back=True)]

    def take_back(self, step: int) -> None:
        """The recovery rule skips the step whose update was already applied: put back the weights of
        before it (the optimizer keeps what it learnt from the step's gradient)."""
        self.update_check.take_back()
        self.taken_back_steps.append(step)

    def skipped(self, step: int) -> None:
        """The recovery rule skipped this step's update (the batch was blamed)."""
        self.skips_in_a_row += 1
        self.skip_steps.append(step)
        self.skipped_steps += 1

    def observe(self, step: int, loss: float | None, grad_norm: float | None) -> None:
        """An applied step: its values join the recent window (a spike left alone is the new normal,
        learnt as such); a clean step earns trust for the pending copy or takes one (never while the
        weights are suspect: a copy of damaged weights must not become trusted)."""
        if not self.params:
            return
        self._time_step(step)
        if not _finite(loss, grad_norm):
            return
        self.detector.add(loss, grad_norm, step)
        self.restored_since_update = False
        if not self.fired:  # a spike applied past `MAX_SKIPS` keeps the count: the data changed
            self.skips_in_a_row = 0
            if self.suspect_since is None:
                self._advance(step)

    def can_restore(self, step: int, why: str) -> bool:
        """A trusted copy can be put back and the window's cap is not reached (each refusal is said)."""
        problem = self.trusted.available()
        if problem is not None:
            logger.warning("hf_hybrid: step %d: %s; %s to restore, carried on", step, why, problem)
            self._clear_suspicion()
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
        self._clear_suspicion()
        return False

    def restore(self, step: int, why: str) -> None:
        """Put back the trusted copy's weights and optimizer state; the batches since it are skipped."""
        self.trusted.restore(self.params, self.optimizer)
        self.detector.forget_after(self.trusted.step)
        since = max(self.trusted.step, self.restore_steps[-1]) if self.restore_steps else self.trusted.step
        skipped = step - since  # batches not yet counted as skipped by an earlier restore of this copy
        self.skipped_steps += skipped
        self.restore_steps.append(step)
        self.pending.step, self.clean_since_pending, self.skips_in_a_row = None, 0, 0
        self.restored_since_update = True
        self._clear_suspicion()
        logger.warning(
            "hf_hybrid: step %d: %s -> restored the weights and optimizer state of step %d, "
            "skipping the %d batches since",
            step,
            why,
            self.trusted.step,
            skipped,
        )
        if not self.trusted.persistent:  # a checkpoint keeps its folder's step
            self.trusted.step = step  # the state is now that copy's, at this step

    def rebase(self, step: int) -> None:
        """The caller saved a checkpoint of this step: the copies start again from it (a pending copy of
        this very state, no trusted one in memory; a trusted checkpoint on disk stays), exactly as a run
        resumed from that checkpoint starts them, so the checkpoint need not hold the copies and the
        resumed run still decides what this one does."""
        if not self.params:
            return
        if not self.trusted.persistent:  # freed, as a resumed run never had it
            self.trusted.clear()
        self.pending.take(step, self.params, self.optimizer)
        self.clean_since_pending = 0

    # ---- internals ---------------------------------------------------------------------------------

    def _gross(self, loss: float) -> bool:
        """This step's loss is more than `GROSS_RISE` of the level above it: bad data, not a hard batch."""
        level = self.detector.level()
        return loss - level > GROSS_RISE * abs(level)

    @property
    def _after_spike(self) -> bool:
        """The step before was skipped or restored as a spike: a smaller rise counts as one too."""
        return self.skips_in_a_row > 0 or self.restored_since_update

    def _quiet(self, step: int) -> None:
        """A step the detector let pass: a suspicion of the weights ends after `patience` quiet steps."""
        if self.suspect_since is None:
            return
        self.quiet_steps += 1
        if self.quiet_steps >= self.config.patience:
            logger.info(
                "hf_hybrid: step %d: the loss came back by itself after the spike of step %d; nothing undone",
                step,
                self.suspect_since,
            )
            self._clear_suspicion()

    def _clear_suspicion(self) -> None:
        self.suspect_since, self.suspect_hits, self.quiet_steps = None, 0, 0

    def _advance(self, step: int) -> None:
        """A clean applied step: a pending copy earns trust; a copy is due every `every` steps."""
        if self.pending.step is not None:
            self.clean_since_pending += 1
            if self.clean_since_pending >= self.config.trust_after:
                self.trusted, self.pending = self.pending, self.trusted
                self.pending.step = None
        every = self.copy_every or self.config.every
        if self.pending.periodic and step % every == 0 and self.pending.step is None:
            if self.copy_every is None:
                self._space_copies(step)
            else:
                self.pending.take(step, self.params, self.optimizer)
            self.clean_since_pending = 0

    def _time_step(self, step: int) -> None:
        """The time since the previous applied step, kept while the copies' spacing is not set (a step
        right after another only: a predict phase or a skipped step in between is not one step)."""
        if self.copy_every is not None:
            return
        now = self.clock()
        if self.last_observed is not None and self.last_observed[0] == step - 1:
            self.step_times.append(now - self.last_observed[1])
        self.last_observed = (step, now)

    def _space_copies(self, step: int) -> None:
        """Take the first periodic copy, timed, and space the next ones so that they cost at most
        `max_copy_share` of the step time (the median of the steps timed before it; the dearest rank's
        share, so that every rank copies at the same steps), every x2^k. The copy is taken twice and the
        second timed: the first allocates its buffers, which later copies reuse (timing it made a tiny
        model's copies look several times dearer than they are)."""
        self.pending.take(step, self.params, self.optimizer)
        cuda = any(p.device.type == "cuda" for p in self.params)
        if cuda:  # the copy's kernels run asynchronously: time them whole, this once
            torch.cuda.synchronize()
        started = self.clock()
        self.pending.take(step, self.params, self.optimizer)
        if cuda:
            torch.cuda.synchronize()
        copy_seconds = self.clock() - started
        if not self.step_times:  # nothing to weigh it against yet (a copy at the first steps)
            return
        step_seconds = max(statistics.median(self.step_times), 1e-9)
        copy_share = largest_over_ranks(copy_seconds / step_seconds, local(self.params[0]).device)
        every = self.config.every
        while copy_share / every > self.config.max_copy_share and every < MAX_SPACING * self.config.every:
            every *= 2
        self.copy_every, self.step_times, self.last_observed = every, [], None
        self._decide_update_check(step_seconds)
        share = copy_share / every
        over = share > self.config.max_copy_share
        (logger.warning if over else logger.info)(
            "hf_hybrid: the spike guard's copy (%.1f MiB) took %.3g s against a %.3g s step: one copy every "
            "%d steps (%.2f%% of the step time%s; a restore goes back up to %d steps)",
            self.pending.nbytes() / 2**20,
            copy_seconds,
            step_seconds,
            every,
            100 * share,
            f", over max_copy_share {self.config.max_copy_share:g}" if over else "",
            every + self.config.trust_after,
        )

    def _decide_update_check(self, step_seconds: float) -> None:
        """Keep the update check where its per-step sample and norm cost at most `max_check_share`."""
        if not self.update_check.on or self.config.max_check_share == 0:
            return
        share = largest_over_ranks(
            self.update_check.cost_seconds(self.clock) / step_seconds, local(self.params[0]).device
        )
        keep = share <= self.config.max_check_share
        if not keep:
            self.update_check.turn_off()
        logger.info(
            "hf_hybrid: the spike guard's update check (a %.2f MiB copy of the weights, taken before a step "
            "whose learning rate or gradient norm jumps) takes %.2f%% of an ordinary step's time: %s",
            self.update_check.nbytes() / 2**20,
            100 * share,
            "on" if keep else f"off, over max_check_share {self.config.max_check_share:g}",
        )

    # ---- what it holds and did --------------------------------------------------------------------

    def tensors(self) -> list[torch.Tensor]:
        """The copies' buffers (both kept: the trusted one and the next, pending or reused)."""
        return [*self.trusted.tensors(), *self.pending.tensors(), *self.update_check.copy]

    def nbytes(self) -> int:
        return self.trusted.nbytes() + self.pending.nbytes() + self.update_check.nbytes()

    def buffer_count(self) -> int:
        """How many buffers the copies hold (changes when a copy is first taken)."""
        return len(self.tensors())

    def stats(self) -> dict[str, Any]:
        """What it did and holds; a guard that is off reports the same keys, nothing done."""
        on = bool(self.params)
        return {
            "spike_guard": on,
            "spike_guard_storage": self.config.storage if on else None,
            "restores": len(self.restore_steps),
            "spike_skipped_steps": self.skipped_steps,
            "restore_steps": list(self.restore_steps),
            "skips": len(self.skip_steps),
            "skip_steps": list(self.skip_steps),
            "spike_guard_bytes": self.nbytes(),
            "spike_guard_copy_every": self.copy_every if on else None,
            "blamed_data": self.blames[DATA],
            "blamed_weights": self.blames[WEIGHTS],
            "update_check": self.update_check.on,
            "updates_taken_back": len(self.taken_back_steps),
            "taken_back_steps": list(self.taken_back_steps),
            "largest_update_ratio": self.update_check.largest_ratio,
            "update_check_copies": self.update_check.copies,
            "unjudged_updates": self.update_check.unjudged,
        }

    def state_dict(self) -> dict[str, Any]:
        """Counters, the detector's window and the suspicion; not the copies: saving the engine first
        `rebase`s them on the saved state itself, which a resumed run copies again (`load_state_dict`)."""
        if self.trusted.step is not None and not self.trusted.persistent:
            raise RuntimeError("SpikeGuard.state_dict() without rebase(): the trusted copy would be lost")
        return {
            "detector": self.detector.state_dict(),
            "trusted_step": self.trusted.step,  # a checkpoint on disk (None for copies in memory)
            "pending_step": self.pending.step,
            "clean_since_pending": self.clean_since_pending,
            "restore_steps": list(self.restore_steps),
            "skip_steps": list(self.skip_steps),
            "skips_in_a_row": self.skips_in_a_row,
            "restored_since_update": self.restored_since_update,
            "skipped_steps": self.skipped_steps,
            "suspicion": [self.suspect_since, self.suspect_hits, self.quiet_steps, self.suspect_level],
            "fired_at": self.fired_at,
            "blames": dict(self.blames),
            "copy_every": self.copy_every,
            "update_check": self.update_check.state_dict(),
            "taken_back_steps": list(self.taken_back_steps),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run: the state as saved at a checkpoint, whose own weights and optimizer state (loaded
        by then) are the pending copy, taken again here."""
        self.detector.load_state_dict(state["detector"])
        self.restore_steps = [int(s) for s in state["restore_steps"]]
        self.skip_steps = [int(s) for s in state.get("skip_steps", [])]
        self.skips_in_a_row = int(state.get("skips_in_a_row", 0))
        self.restored_since_update = bool(state.get("restored_since_update", False))
        self.skipped_steps = int(state["skipped_steps"])
        since, hits, quiet, level = state.get("suspicion", [None, 0, 0, 0.0])
        self.suspect_since = None if since is None else int(since)
        self.suspect_hits, self.quiet_steps, self.suspect_level = int(hits), int(quiet), float(level)
        fired_at = state.get("fired_at")
        self.fired_at = None if fired_at is None else int(fired_at)
        self.blames = {DATA: 0, WEIGHTS: 0, **{k: int(v) for k, v in state.get("blames", {}).items()}}
        saved_every = state.get("copy_every", self.config.every)  # before the spacing: every `every`
        self.copy_every = None if saved_every is None else int(saved_every)
        self.step_times, self.last_observed = [], None
        if "update_check" in state:  # saved before the check existed: it starts afresh
            self.update_check.load_state_dict(state["update_check"])
        self.taken_back_steps = [int(s) for s in state.get("taken_back_steps", [])]
        self.trusted.clear()
        self.pending.clear()
        self.clean_since_pending = int(state.get("clean_since_pending", 0))
        pending, trusted = state.get("pending_step"), state.get("trusted_step")
        if self.params and pending is not None:
            self.pending.take(int(pending), self.params, self.optimizer)
        if self.params and trusted is not None and self.trusted.persistent:
            self.trusted.take(int(trusted), self.params, self.optimizer)


def _finite(loss: float | None, grad_norm: float | None) -> bool:
    values = [v for v in (loss, grad_norm) if v is not None]
    return bool(values) and all(math.isfinite(v) for v in values)
