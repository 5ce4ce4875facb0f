"""Fault injection for HybridHFTrainer: hooks, callbacks and wrapper predictors that the test owns.

Nothing here edits the library. A fault is aimed with a `Trigger` (a phase, and the first step at or
after which it may fire) and injected where a real fault would arise:

* `corrupt_loss`: a forward hook replaces the model output's loss (non-finite loss, loss spike);
* `corrupt_grads`: a tensor hook on every trainable parameter rewrites its gradient (NaN, 1e8x);
* `fault_predictor`: a predictor registered under a fresh name that wraps the EMA predictor and
  misbehaves when its trigger fires (NaN/inf, enormous, wrong shape, raises, confidently wrong);
* `scale_lr`: a forward hook multiplies the learning rate (and the scheduler's base rates, so the
  schedule keeps it) at the triggering step.

The trigger reads the phase from the engine's controller, which the trainer sets on the step's first
micro-batch, before the forward pass: every injection point above runs after it.
"""

from __future__ import annotations

import copy
import hashlib
import math
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import torch
from helpers import hybrid_trainer, tiny_gpt2
from transformers import TrainerCallback

from hf_hybrid import HybridHFTrainer
from hf_hybrid.engine.phases import Phase
from hf_hybrid.engine.predictor import EMAPredictor, register_predictor

# Frozen in every fault model, so "frozen weights never move" is checked in every test.
FROZEN = ("transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias")
REAL_PHASES = ("warmup", "full", "correct")  # the phases that run a backward pass
ALL_PHASES = ("warmup", "full", "predict", "correct")
_names = count()


def fault_model(seed: int = 0) -> torch.nn.Module:
    """Tiny GPT-2 with a few frozen tensors."""
    model = tiny_gpt2(seed)
    for name, p in model.named_parameters():
        if name in FROZEN:
            p.requires_grad_(False)
    return model


# Every trigger aimed at a trainer, so that the invariants know which of its steps were faulted.
_TRIGGERS: weakref.WeakKeyDictionary[Any, list[Trigger]] = weakref.WeakKeyDictionary()


def fault_steps(trainer: Any) -> set[int]:
    """0-based steps of `trainer` at which any fault aimed at it fired."""
    return {step for trigger in _TRIGGERS.get(trainer, []) for step in trigger.steps}


@dataclass
class Firing:
    """One step at which a fault fired, with the monitor's view of the loss just before it."""

    step: int  # 0-based optimizer step (index into trainer.hybrid_timeline)
    phase: str
    pre_loss_mean: float
    pre_loss_std: float


@dataclass
class Trigger:
    """Fires at up to `times` steps of phase `phase`, from step `after` on.

    `mid_phase=True` (PREDICT only) waits until the open predict phase has applied a predicted update,
    so a rollback has something to undo.
    """

    trainer: HybridHFTrainer
    phase: str
    after: int = 0
    times: int = 1
    mid_phase: bool = False
    firings: list[Firing] = field(default_factory=list)

    def __post_init__(self) -> None:
        _TRIGGERS.setdefault(self.trainer, []).append(self)

    def active(self) -> bool:
        """Is this step a fault step? Idempotent within a step (hooks may ask once per tensor)."""
        engine = self.trainer.engine
        if engine is None or engine.controller.phase is None:
            return False
        step = self.trainer.state.global_step
        if self.firings and self.firings[-1].step == step:
            return True
        if len(self.firings) >= self.times or step < self.after:
            return False
        if engine.controller.phase is not Phase(self.phase):
            return False
        if self.mid_phase and not self._moved_since_snapshot(engine):
            return False
        mean, std = engine.monitor.loss_stats()
        self.firings.append(Firing(step, self.phase, mean, std))
        return True

    @staticmethod
    def _moved_since_snapshot(engine: Any) -> bool:
        snapshot = engine.guard.snapshot
        return bool(snapshot) and any(not torch.equal(snapshot[n], p) for n, p in engine.params.items())

    @property
    def steps(self) -> list[int]:
        return [f.step for f in self.firings]


def corrupt_loss(trainer: HybridHFTrainer, trigger: Trigger, make_bad: Callable[[torch.Tensor], Any]) -> None:
    """At fault steps the forward pass returns `make_bad(loss)` as its loss."""

    def hook(module: torch.nn.Module, inputs: Any, output: Any) -> Any:
        if trigger.active():
            output.loss = make_bad(output.loss)
        return output

    trainer.model.register_forward_hook(hook)


def corrupt_grads(
    trainer: HybridHFTrainer, trigger: Trigger, make_bad: Callable[[torch.Tensor], Any]
) -> list[int]:
    """At fault steps every trainable parameter's gradient becomes `make_bad(grad)`.

    Returns a list that records the step of every corrupted gradient (to prove the hook fired).
    """
    fired: list[int] = []

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if trigger.active():
            fired.append(trainer.state.global_step)
            return make_bad(grad)
        return grad

    for p in trainer.model.parameters():
        if p.requires_grad:
            p.register_hook(hook)
    return fired


def scale_lr(trainer: HybridHFTrainer, trigger: Trigger, factor: float) -> None:
    """At the fault step multiply every group's learning rate and the scheduler's base rates by `factor`
    (the schedule would otherwise restore the old rate at its next step)."""

    def hook(module: torch.nn.Module, inputs: Any, output: Any) -> Any:
        if trigger.active() and not getattr(hook, "done", False):
            hook.done = True  # type: ignore[attr-defined]
            for group in trainer.optimizer.param_groups:
                group["lr"] *= factor
            scheduler = trainer.lr_scheduler
            scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
        return output

    trainer.model.register_forward_hook(hook)


# ---- predictors that misbehave on cue ---------------------------------------------------------


def nan_delta(out: dict[str, torch.Tensor], params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = dict(out)
    name = sorted(out)[-1]
    out[name] = out[name].clone()
    out[name].view(-1)[0] = math.nan
    return out


def inf_delta(out: dict[str, torch.Tensor], params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: torch.full_like(t, math.inf) for name, t in out.items()}


def enormous_delta(
    out: dict[str, torch.Tensor], params: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    return {name: torch.sign(t) * 1e30 + 1e29 for name, t in out.items()}


def wrong_shape_delta(
    out: dict[str, torch.Tensor], params: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Every tensor flattened with one extra element: not its parameter's shape, and not broadcastable."""
    return {name: torch.cat([t.reshape(-1), t.reshape(-1)[:1]]) for name, t in out.items()}


def raising_delta(
    out: dict[str, torch.Tensor], params: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    raise RuntimeError("injected predictor failure")


def confidently_wrong(factor: float = -50.0) -> Callable[..., dict[str, torch.Tensor]]:
    def fault(out: dict[str, torch.Tensor], params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: t * factor for name, t in out.items()}

    return fault


PREDICTOR_FAULTS: dict[str, Callable[..., dict[str, torch.Tensor]]] = {
    "nan": nan_delta,
    "inf": inf_delta,
    "enormous": enormous_delta,
    "wrong_shape": wrong_shape_delta,
    "raises": raising_delta,
}


class FaultyPredictor(EMAPredictor):
    """The EMA predictor, whose output `fault` replaces whenever `trigger` fires (set per test)."""

    name = "fault-base"
    trigger: Trigger | None = None
    fault: Callable[..., dict[str, torch.Tensor]] | None = None
    calls_faulted = 0
    resets = 0

    def predict(self, steps_ahead: int) -> dict[str, torch.Tensor] | None:
        out = super().predict(steps_ahead)
        cls = type(self)
        if out is None or cls.trigger is None or cls.fault is None or not cls.trigger.active():
            return out
        cls.calls_faulted += 1
        return cls.fault(out, cls.trigger.trainer.engine.params)

    def reset(self) -> None:
        type(self).resets += 1
        super().reset()


def fault_predictor(fault: Callable[..., Any]) -> type[FaultyPredictor]:
    """A fresh FaultyPredictor subclass registered for this test only (the suite's conftest removes it).

    Arm it once the trainer exists: `cls.trigger = Trigger(trainer, ...)`.
    """
    name = f"fault-{next(_names)}"
    cls = type(f"FaultyPredictor_{name}", (FaultyPredictor,), {"name": name, "fault": staticmethod(fault)})
    register_predictor(name, cls)
    return cls


# ---- running a faulted trainer -------------------------------------------------------------------

# Warmup long enough that the divergence monitor (10 steps of history) is armed inside it.
FAULT_ARGS: dict[str, Any] = {
    "max_steps": 40,
    "hybrid_warmup_steps": 14,
    "save_strategy": "no",  # only the save that `SaveAfterFault` requests (no final save either)
}
# Where in a run each phase is aimed at: a warmup step the monitor can judge, a FULL step after the
# first predict phase, a PREDICT step after a predicted update was applied, the first CORRECT step.
AIM: dict[str, dict[str, Any]] = {
    "warmup": {"after": 11},
    "full": {"after": 22},
    "predict": {"mid_phase": True},
    "correct": {},
}


class SaveAfterFault(TrainerCallback):
    """Checkpoint at the end of the first fault step: the save most likely to catch a poisoned state."""

    def __init__(self, trigger: Trigger) -> None:
        self.trigger = trigger

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trigger.steps and state.global_step == self.trigger.steps[0] + 1:
            control.should_save = True


class StepWatch(TrainerCallback):
    """Trainable weights before and after every fault step, and the engine's confidence after it."""

    def __init__(self, trainer: HybridHFTrainer, trigger: Trigger) -> None:
        self.trainer = trainer
        self.trigger = trigger
        self.before: dict[str, torch.Tensor] = {}
        self.steps: dict[int, dict[str, Any]] = {}

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        engine = self.trainer.engine
        self.before = {
            n: p.detach().clone() for n, p in self.trainer.model.named_parameters() if p.requires_grad
        }
        self.snapshot = {n: t.clone() for n, t in engine.guard.snapshot.items()} if engine else {}
        self.stats = dict(engine.stats()) if engine else {}
        self.opt_state = copy.deepcopy(self.trainer.optimizer.state_dict()["state"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step - 1
        if step in self.trigger.steps:
            if not self.snapshot and self.trainer.hybrid_timeline[-1]["phase"] == "predict":
                self.snapshot = self.before  # the phase opened in this step: its snapshot is the start
            after = {
                n: p.detach().clone() for n, p in self.trainer.model.named_parameters() if p.requires_grad
            }
            engine = self.trainer.engine
            self.steps[step] = {
                "before": self.before,
                "after": after,
                "confidence": engine.confidence(),
                "horizon_cap": engine.controller.horizon_cap,
                "observed": engine.predictor.observed,
                "snapshot": self.snapshot,
                "stats_before": self.stats,
                "stats_after": dict(engine.stats()),
                "optimizer_unchanged": same_optimizer_state(
                    self.opt_state, self.trainer.optimizer.state_dict()["state"]
                ),
            }

    def unchanged(self, step: int) -> bool:
        """The step applied nothing: every trainable weight is bit-identical to before it."""
        record = self.steps[step]
        return all(torch.equal(record["before"][n], record["after"][n]) for n in record["before"])

    def restored(self, step: int) -> bool:
        """The step ended exactly on the open predict phase's snapshot (a rollback)."""
        record = self.steps[step]
        snapshot = record["snapshot"]
        return bool(snapshot) and all(torch.equal(snapshot[n], record["after"][n]) for n in snapshot)

    def grew(self, step: int, counter: str) -> int:
        """How much an engine counter grew during the step."""
        record = self.steps[step]
        return record["stats_after"][counter] - record["stats_before"][counter]


def same_optimizer_state(a: dict[Any, Any], b: dict[Any, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        if a[key].keys() != b[key].keys():
            return False
        for name, x in a[key].items():
            y = b[key][name]
            if not (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y):
                return False
    return True


def faulted_trainer(
    tmp_path: Any, invariants: Any, phase: str, aim: dict[str, Any] | None = None, **overrides: Any
) -> tuple[HybridHFTrainer, Trigger]:
    """A watched hybrid trainer on the fault model, a trigger aimed at `phase` (where `AIM` says, or
    `aim`), and a checkpoint saved right after the first fault step."""
    # the divergence monitor's own handling is what these faults test: the spike guard stays out
    guard = {"hybrid_spike_guard": "off"}
    trainer = hybrid_trainer(tmp_path, model=fault_model(), **{**FAULT_ARGS, **guard, **overrides})
    invariants.watch(trainer)
    trigger = Trigger(trainer, phase, **(AIM[phase] if aim is None else aim))
    trainer.add_callback(SaveAfterFault(trigger))
    return trainer, trigger


# ---- reading the outcome -------------------------------------------------------------------------


def timeline_after(trainer: HybridHFTrainer, step: int, n: int) -> list[str]:
    """Phases of the `n` steps after `step`."""
    return [row["phase"] for row in trainer.hybrid_timeline[step + 1 : step + 1 + n]]


def assert_loss_recovered(trainer: HybridHFTrainer, firing: Firing, last: int = 5) -> None:
    """The mean loss of the last `last` real steps is back within the monitor's tolerance of the loss it
    saw before the fault: at most `sigma` running standard deviations above the running mean."""
    sigma = trainer.engine.config.divergence_sigma
    real = [
        row["loss"]
        for row in trainer.hybrid_timeline[firing.step + 1 :]
        if row["phase"] != "predict" and row["loss"] is not None
    ][-last:]
    assert len(real) == last, f"fewer than {last} real steps after the fault at step {firing.step}"
    assert all(math.isfinite(x) for x in real), real
    mean = sum(real) / len(real)
    bound = firing.pre_loss_mean + sigma * firing.pre_loss_std
    assert mean <= bound, (
        f"loss {mean:.4f} after recovery is above the monitor's tolerance {bound:.4f} "
        f"(mean {firing.pre_loss_mean:.4f} + {sigma} x std {firing.pre_loss_std:.4f})"
    )


# ---- one step's outcome, to compare a resumed run with the uninterrupted one ----------------------


def _digest(items: Any) -> str:
    digest = hashlib.sha256()
    for name, value in items:
        digest.update(str(name).encode())
        if isinstance(value, torch.Tensor):
            digest.update(str(value.dtype).encode())
            digest.update(value.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()


def state_digests(trainer: Any) -> dict[str, str]:
    """SHA-256 of every weight (frozen ones too) and of the optimizer state, bit for bit."""
    weights = sorted(trainer.model.named_parameters())
    state = trainer.optimizer.state_dict()["state"]
    moments = [
        (f"{key}.{name}", value) for key in sorted(state) for name, value in sorted(state[key].items())
    ]
    return {"weights": _digest(weights), "optimizer": _digest(moments)}


def step_record(trainer: Any) -> dict[str, Any]:
    """What a step left behind: the digests, the engine's timeline row (its clock reading aside) and its
    counters (the byte meters aside: they are re-read at their own pace, not at every step)."""
    row = {k: v for k, v in trainer.hybrid_timeline[-1].items() if k != "seconds"}
    stats = {k: v for k, v in trainer.engine.stats().items() if not k.endswith("_bytes")}
    return {**state_digests(trainer), "row": row, "stats": stats}
