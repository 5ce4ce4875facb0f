"""Weight-delta predictors: guess the next optimizer updates from the real ones seen so far.

Buffers are fp32 whatever the model dtype (small updates are not rounded away) and keyed by parameter
name, never by `id()`. Bring your own: subclass `DeltaPredictor` and register it (docs/extending.md).
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from .sample import CoordinateSample
from .sharding import local
from .validation import check_float

Deltas = dict[str, torch.Tensor]


class DeltaPredictor(ABC):
    """What the engine asks of a predictor (the contract).

    - `observe(deltas)`: after each real step the engine observes (every step awake; every
      `dormant_every`-th, averaged per step, dormant): `deltas[name]`, the real fp32 one-step update.
    - `predict(steps_ahead)`: the update `steps_ahead` (>= 1) steps after the last real one, as {name:
      tensor shaped like the parameter} for any subset, or None. Scored in FULL steps, applied (scaled,
      clipped, refused whole if not finite or misshaped) in PREDICT steps; it must change nothing itself.
    - `reset()`: forget everything (after its output was refused or raised).
    - `tensors()`/`load_tensors()`, `extra_state()`/`load_extra_state()`: the checkpointed state (flat-named
      tensors; JSON-able scalars); resume must continue bit for bit.
    - Its buffers count in the engine's bytes (`nbytes`): keep them O(1) per parameter. No predict phase
      opens before `min_history` `observed` updates.
    Built by name it gets `**predictor_kwargs`; with `needs_optimizer = True` also `params=`, `optimizer=`
    and `sample=`.

    A sleeping engine builds it on a `CoordinateSample`: `observe`/`predict` see 1-D tensors of the sampled
    coordinates (a `needs_optimizer` one reads at `sample.gather(name, tensor)`); one that needs full
    shapes sets `supports_sampling = False` and the engine never sleeps. Under FSDP2 it sees this rank's
    shard (`sharding.local`): exact only if each coordinate's guess uses that coordinate's history alone,
    else set `supports_sharding = False` (refused under sharding). Guesses are scored on the sample: a
    `supports_sharding` predictor also gets a twin built there, any other's guess is gathered at it.
    One that does not read the real updates sets `needs_deltas = False`: it gets an empty mapping, and the
    awake engine keeps no full-size copy of the parameters for it.
    """

    name: ClassVar[str]
    needs_optimizer: ClassVar[bool] = False
    needs_deltas: ClassVar[bool] = True
    supports_sampling: ClassVar[bool] = True
    supports_sharding: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass without a `name` is named by its class until registered (checkpoints name it)."""
        super().__init_subclass__(**kwargs)
        if not hasattr(cls, "name"):
            cls.name = cls.__qualname__
            cls._default_name = True

    def __init__(self) -> None:
        self.observed = 0

    @abstractmethod
    def observe(self, deltas: Mapping[str, torch.Tensor]) -> None:
        """Learn from the real update of one optimizer step."""

    @abstractmethod
    def predict(self, steps_ahead: int) -> Deltas | None:
        """The update expected `steps_ahead` (>= 1) steps after the last observed one."""

    @abstractmethod
    def reset(self) -> None:
        """Forget everything (after its output was refused or the run diverged)."""

    @abstractmethod
    def tensors(self) -> dict[str, torch.Tensor]:
        """Buffers to checkpoint, flat-named."""

    @abstractmethod
    def load_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None: ...

    def extra_state(self) -> dict[str, Any]:
        """JSON-able scalars to checkpoint next to `tensors()`."""
        return {}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "observed": self.observed, "extra": self.extra_state(), **self.tensors()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["name"] != self.name:
            raise ValueError(f"predictor state is for {state['name']!r}, this predictor is {self.name!r}")
        self.observed = int(state["observed"])
        self.load_extra_state(state["extra"])
        self.load_tensors({k: v for k, v in state.items() if isinstance(v, torch.Tensor)})

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


AUTO = "auto"
AUTO_CANDIDATES = ("adam", "ema")  # what `auto` may resolve to (`resolve_predictor_name`)
_REGISTRY: dict[str, type[DeltaPredictor]] = {}
_BUILTIN: set[str] = set()


def register_predictor(
    name: str, cls: type[DeltaPredictor], *, override: bool = False
) -> type[DeltaPredictor]:
    """Make `cls` available as `hybrid_predictor=name`; a taken name is refused unless `override=True`."""
    if not isinstance(name, str) or not name or name == AUTO:
        raise ValueError(f"a predictor name must be a non-empty string other than {AUTO!r}, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, DeltaPredictor)):
        raise TypeError(f"register_predictor({name!r}, ...) needs a DeltaPredictor subclass, got {cls!r}")
    own = None if cls.__dict__.get("_default_name") else cls.__dict__.get("name")
    if own is not None and own != name:
        raise ValueError(f"{cls.__qualname__}.name is {own!r}; register it under that name, not {name!r}")
    if name in _REGISTRY and _REGISTRY[name] is not cls and not override:
        kind = "built-in predictor" if name in _BUILTIN else "predictor"
        raise ValueError(
            f"{name!r} is already a registered {kind} ({_REGISTRY[name].__qualname__}); "
            "pass override=True to replace it, or choose another name"
        )
    cls.name = name
    cls._default_name = False
    _REGISTRY[name] = cls
    return cls


def unregister_predictor(name: str) -> None:
    """Remove a predictor registered by `register_predictor` (built-ins stay)."""
    if name in _BUILTIN:
        raise ValueError(f"{name!r} is a built-in predictor and cannot be unregistered")
    _REGISTRY.pop(name, None)


def available_predictors() -> list[str]:
    """Registered names, sorted (`auto` is not one: it resolves to one of them)."""
    return sorted(_REGISTRY)


def predictor_class(name: str) -> type[DeltaPredictor]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown predictor {name!r}; available: {[AUTO, *available_predictors()]}")
    return _REGISTRY[name]


INJECTED_ARGUMENTS = ("params", "optimizer", "sample")  # what `build_predictor` passes itself


def constructor_arguments(name: str) -> list[str] | None:
    """The keyword arguments a predictor takes from `predictor_kwargs` (None: any, it has `**kwargs`)."""
    parameters = list(inspect.signature(predictor_class(name).__init__).parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.kind in keyword and p.name not in INJECTED_ARGUMENTS]


def _builtin(cls: type[DeltaPredictor]) -> type[DeltaPredictor]:
    register_predictor(cls.name, cls)
    _BUILTIN.add(cls.name)
    return cls


def resolve_predictor_name(name: str, optimizer: torch.optim.Optimizer | None) -> str:
    """`auto`: the Adam replay (no buffer of its own) for a plain torch Adam/AdamW, else the EMA. Not the
    default: the replay's high skill keeps the engine awake (+18% time on MiniLM on CPU, EMA +2%)."""
    if name != AUTO:
        return name
    return AdamReplayPredictor.name if AdamReplayPredictor.supports(optimizer) else EMAPredictor.name


def build_predictor(
    name: str,
    params: Mapping[str, torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    sample: CoordinateSample | None = None,
    **kwargs: Any,
) -> DeltaPredictor:
    """A registered predictor; `needs_optimizer` ones get params, optimizer and the coordinate sample."""
    cls = predictor_class(name)
    if cls.needs_optimizer:
        if optimizer is None or params is None:
            raise ValueError(f"predictor {name!r} needs the optimizer and the parameters")
        return cls(params=params, optimizer=optimizer, sample=sample, **kwargs)
    return cls(**kwargs)


@_builtin
class NullPredictor(DeltaPredictor):
    """Applies no update: the control every real predictor must beat (a predict step = a skipped batch)."""

    name = "null"
    needs_deltas = False

    def observe(self, deltas: Mapping[str, torch.Tensor]) -> None:
        self.observed += 1

    def predict(self, steps_ahead: int) -> Deltas | None:
        return None

    def reset(self) -> None:
        self.observed = 0

    def tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def load_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        return None


@_builtin
class EMAPredictor(DeltaPredictor):
    """Bias-corrected EMA of the real updates, damped by `decay` per predicted step: with no new gradient
    Adam's first moment shrinks too, and an undamped replay overshoots (loss spikes at horizons > 4)."""

    name = "ema"

    def __init__(self, beta: float = 0.9, decay: float = 0.9) -> None:
        super().__init__()
        check_float("beta", beta, 0.0, 1.0, high_open=True)
        check_float("decay", decay, 0.0, 1.0, low_open=True)
        self.beta = beta
        self.decay = decay
        self.ema: Deltas = {}

    def observe(self, deltas: Mapping[str, torch.Tensor]) -> None:
        """ema += (1 - beta) * (delta - ema), one fused pass per tensor, all tensors in one call."""
        for name, delta in deltas.items():
            if name not in self.ema:
                self.ema[name] = torch.zeros_like(delta, dtype=torch.float32)
        if deltas:
            buffers = [self.ema[name] for name in deltas]
            torch._foreach_lerp_(buffers, [d.float() for d in deltas.values()], 1.0 - self.beta)
        self.observed += 1

    def predict(self, steps_ahead: int) -> Deltas | None:
        if self.observed == 0:
            return None
        bias_correction = 1.0 - self.beta**self.observed
        factor = self.decay**steps_ahead / bias_correction
        return dict(zip(self.ema, torch._foreach_mul(list(self.ema.values()), factor), strict=True))

    def reset(self) -> None:
        self.ema.clear()
        self.observed = 0

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f"ema.{name}": buf for name, buf in self.ema.items()}

    def load_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.ema = {key.removeprefix("ema."): t.float().clone() for key, t in tensors.items()}


@_builtin
class AdamReplayPredictor(DeltaPredictor):
    """The optimizer's own next step with no new gradient: m and v decayed by beta1**k, beta2**k, the
    update -lr * m_hat / (sqrt(v_hat) + eps) (+ AdamW's decay), read from the live state; no buffer."""

    name = "adam"
    needs_optimizer = True
    needs_deltas = False

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        optimizer: torch.optim.Optimizer,
        sample: CoordinateSample | None = None,
    ) -> None:
        super().__init__()
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper keeps the real one here
        if not self.supports(optimizer):
            raise ValueError(
                "hybrid_predictor='adam' replays torch.optim.Adam/AdamW state (without amsgrad or "
                f"maximize); the optimizer is {type(inner).__module__}.{type(inner).__qualname__} (use "
                "optim='adamw_torch', or another predictor)"
            )
        self.optimizer = inner
        self.params = dict(params)
        self.sample = sample
        self.group_of = {id(p): group for group in inner.param_groups for p in group["params"]}

    @staticmethod
    def supports(optimizer: torch.optim.Optimizer | None) -> bool:
        inner = getattr(optimizer, "optimizer", optimizer)
        return isinstance(inner, torch.optim.Adam | torch.optim.AdamW) and not any(
            group.get("amsgrad") or group.get("maximize") for group in inner.param_groups
        )

    def observe(self, deltas: Mapping[str, torch.Tensor]) -> None:
        self.observed += 1

    @torch.no_grad()
    def predict(self, steps_ahead: int) -> Deltas | None:
        out: Deltas = {}
        for name, p in self.params.items():
            state = self.optimizer.state.get(p)
            if not state or "exp_avg" not in state:
                continue
            group = self.group_of[id(p)]
            beta1, beta2 = group["betas"]
            step = float(state["step"]) + steps_ahead
            m_hat = self._read(name, state["exp_avg"]).float() * beta1**steps_ahead / (1 - beta1**step)
            v_hat = self._read(name, state["exp_avg_sq"]).float() * beta2**steps_ahead / (1 - beta2**step)
            lr = float(group["lr"])
            update = -lr * m_hat / (v_hat.sqrt() + group["eps"])
            if isinstance(self.optimizer, torch.optim.AdamW) and group["weight_decay"]:
                update -= lr * group["weight_decay"] * self._read(name, p).float()
            out[name] = update
        return out or None

    def _read(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The parameter's or its optimizer state's values here: its shard, or the shard's sample."""
        tensor = local(tensor).detach()
        return tensor if self.sample is None else self.sample.gather(name, tensor)

    def reset(self) -> None:
        self.observed = 0

    def tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def load_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        return None


def delta_dot_products(
    predicted: Mapping[str, torch.Tensor] | None, real: Mapping[str, torch.Tensor]
) -> tuple[float, float, float]:
    """(<p, d>, <p, p>, <d, d>) over all tensors in one float64 vector (three dot products, not three per
    tensor; no float32 overflow), read back with one sync. A parameter the guess leaves out counts as zero."""
    if not real:
        return 0.0, 0.0, 0.0
    device = next(iter(real.values())).device  # a model split over devices is gathered onto one
    d = _flat([t.reshape(-1) for t in real.values()], device)
    if not predicted:
        return 0.0, 0.0, float(torch.dot(d, d))
    zero = d.new_zeros(())
    p = _flat(
        [
            predicted[name].reshape(-1) if name in predicted else zero.expand(t.numel())
            for name, t in real.items()
        ],
        device,
    )
    pd, pp, dd = torch.stack([torch.dot(p, d), torch.dot(p, p), torch.dot(d, d)]).tolist()
    return pd, pp, dd


def _flat(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One float64 vector: concatenated first, converted once (not once per tensor)."""
    return torch.cat([t if t.device == device else t.to(device) for t in tensors]).to(torch.float64)


def cosine(pd: float, pp: float, dd: float) -> float:
    """Cosine similarity from dot products; 0 when either side is zero."""
    denom = math.sqrt(pp * dd)
    return pd / denom if denom > 0 else 0.0
