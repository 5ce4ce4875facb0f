"""The loss forecaster ("RSSM-lite" in the seed): a tiny GRU that forecasts the training loss online.

It scores its one-step error against two naive baselines (last value, EMA) on the same steps and is
:attr:`LossForecaster.trusted` only when it beats both. Loss levels drift, so it models the normalised
next change of loss (`LossLevels`), with a Gaussian NLL head so ``std`` is a calibrated-ish spread.
CPU float32 with a private generator: bit-identical on every rank, the global RNG untouched. No transformers.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
from torch import nn

from .validation import check_float, check_int

logger = logging.getLogger(__name__)

__all__ = ["LossForecaster", "LossForecast"]

_NUM_PHASES = 4  # 0: warmup, 1: full, 2: predict, 3: correct
_INPUT_SIZE = 5 + _NUM_PHASES  # d, dev, lr_rel, gn_rel, gn_missing, phase one-hot
_FEATURE_CLIP = 8.0
_LOGVAR_MIN = -8.0
_LOGVAR_MAX = 4.0
_SCALE_BETA = 0.95  # running scale of |loss change|
_LOG_EMA_BETA = 0.9  # running log lr / log grad norm
_ERROR_BETA = 0.99  # exponential weighting of the running absolute errors (~100 scored steps)
_GAUSS_MAE_TO_STD = math.sqrt(math.pi / 2.0)  # std of a zero-mean Gaussian from its mean absolute value
_CONFIG = ("hidden_size", "window", "learning_rate", "train_iters", "train_every", "ema_beta", "min_history")


@dataclass(frozen=True)
class LossForecast:
    """Forecast for steps ``t+1 .. t+horizon`` (``std`` > 0); ``source``: ``"gru"`` when trusted, else
    the best baseline (``"last_value"`` or ``"ema"``)."""

    mean: list[float]
    std: list[float]
    source: str


def _scale_floor(loss: float) -> float:
    """Smallest usable scale: keeps divisions finite when the loss is exactly constant."""
    return 1e-8 + 1e-6 * abs(loss)


def _clip(x: float) -> float:
    return max(-_FEATURE_CLIP, min(_FEATURE_CLIP, x))


def _row(d: float, dev: float, lr_rel: float, gn_rel: float, gn_missing: float, phase: int) -> torch.Tensor:
    """One step's features, (1, input_size)."""
    values = [d, dev, lr_rel, gn_rel, gn_missing] + [0.0] * _NUM_PHASES
    values[5 + phase] = 1.0
    with torch.inference_mode(False):
        return torch.tensor([values], dtype=torch.float32)


def _relative(log_value: float | None, running: float | None) -> tuple[float, float | None]:
    """A log value against its running mean (clipped), and the mean moved towards it (missing: 0)."""
    if log_value is None:
        return 0.0, running
    running = log_value if running is None else running
    return _clip(log_value - running), _LOG_EMA_BETA * running + (1.0 - _LOG_EMA_BETA) * log_value


@dataclass
class LossLevels:
    """The running statistics that normalise each step's features; plain scalars, saved as they are."""

    losses: list[float] = field(default_factory=list)  # the last `window` accepted losses
    count: int = 0  # accepted losses so far
    last_loss: float = 0.0
    ema: float = 0.0
    scale: float = 0.0  # 0.0 until the first loss change is seen
    log_lr_ema: float | None = None
    log_gn_ema: float | None = None
    last_lr_rel: float = 0.0
    last_gn_rel: float = 0.0
    last_gn_missing: float = 1.0
    last_phase: int = 0

    def append(
        self, loss: float, lr: float, grad_norm: float | None, phase: int, ema_beta: float, window: int
    ) -> torch.Tensor:
        """Take an accepted loss into the statistics and return its feature row."""
        if self.count == 0:
            d, self.ema, self.scale = 0.0, loss, 0.0
        else:
            diff = loss - self.last_loss
            floor = _scale_floor(loss)
            if self.scale <= 0.0:
                self.scale = max(abs(diff), floor)
            d = _clip(diff / max(self.scale, floor))
            self.scale = max(_SCALE_BETA * self.scale + (1.0 - _SCALE_BETA) * abs(diff), floor)
            self.ema = ema_beta * self.ema + (1.0 - ema_beta) * loss
        self.last_loss = loss
        self.count += 1
        self.losses = [*self.losses, loss][-window:]
        dev = _clip((loss - self.ema) / self.usable_scale())
        log_lr = math.log(max(lr, 1e-12)) if math.isfinite(lr) else None
        self.last_lr_rel, self.log_lr_ema = _relative(log_lr, self.log_lr_ema)
        usable = grad_norm is not None and math.isfinite(float(grad_norm)) and float(grad_norm) > 0.0
        log_gn = math.log(float(grad_norm)) if usable else None  # type: ignore[arg-type]
        self.last_gn_rel, self.log_gn_ema = _relative(log_gn, self.log_gn_ema)
        self.last_gn_missing = 0.0 if usable else 1.0
        self.last_phase = phase
        return _row(d, dev, self.last_lr_rel, self.last_gn_rel, self.last_gn_missing, phase)

    def usable_scale(self) -> float:
        return self.scale if self.scale > 0.0 else _scale_floor(self.last_loss)

    def recent_change_std(self) -> float:
        """Spread of the recent one-step loss changes; a floor when there are too few."""
        losses = self.losses
        floor = max(1e-3 * abs(self.last_loss), 1e-6)
        if len(losses) < 3:
            return floor
        diffs = [b - a for a, b in zip(losses[:-1], losses[1:], strict=False)]
        m = sum(diffs) / len(diffs)
        var = sum((x - m) ** 2 for x in diffs) / (len(diffs) - 1)
        return max(math.sqrt(var), floor)


@dataclass
class OneStepScores:
    """The one-step forecasts of the GRU and both baselines, scored on the same steps by bias-corrected EMA
    (~100 steps) absolute errors, which follow the training's regime changes."""

    pending: list[float] | None = None  # (gru, last value, ema), made at the previous step
    err_acc: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    err_norm: float = 0.0
    scored: int = 0

    def score(self, loss: float) -> None:
        """Score the pending forecasts against the loss that came."""
        if self.pending is None:
            return
        b = _ERROR_BETA
        pairs = zip(self.err_acc, self.pending, strict=True)
        self.err_acc = [b * acc + (1.0 - b) * abs(loss - p) for acc, p in pairs]
        self.err_norm = b * self.err_norm + (1.0 - b)
        self.scored += 1
        self.pending = None

    def errors(self) -> dict[str, float]:
        if self.err_norm > 0.0:
            gru, lv, ema = (a / self.err_norm for a in self.err_acc)
        else:
            gru = lv = ema = float("nan")
        return {"gru_mae": gru, "last_value_mae": lv, "ema_mae": ema, "scored_steps": self.scored}


class GaussianGRU:
    """The GRU, its (mean, log-variance) head and their Adam, built on meta and initialised from a private
    generator: nn.Module constructors would draw from the *global* RNG, which must stay untouched."""

    def __init__(self, hidden_size: int, learning_rate: float, seed: int) -> None:
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        with torch.inference_mode(False), torch.no_grad():
            self.gru = nn.GRU(
                _INPUT_SIZE, hidden_size, batch_first=True, dtype=torch.float32, device="meta"
            ).to_empty(device="cpu")
            self.head = nn.Linear(hidden_size, 2, dtype=torch.float32, device="meta").to_empty(device="cpu")
            bound = 1.0 / math.sqrt(hidden_size)
            for p in self.gru.parameters():
                p.uniform_(-bound, bound, generator=self.generator)
            # Small output layer: the untrained model predicts "no change" (= last value) with unit spread.
            self.head.weight.uniform_(-0.01, 0.01, generator=self.generator)
            self.head.bias.zero_()
        self.params: list[nn.Parameter] = [*self.gru.parameters(), *self.head.parameters()]
        self.optimizer = torch.optim.Adam(self.params, lr=learning_rate)

    def step(self, rows: torch.Tensor, h: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """(mean, log-variance) of the normalised change after the last of `rows`, and the hidden state."""
        out, h = self.gru(rows.unsqueeze(0), h)
        y = self.head(out[:, -1])
        return y[..., 0], y[..., 1].clamp(_LOGVAR_MIN, _LOGVAR_MAX), h

    def train(self, features: torch.Tensor, iters: int) -> None:
        """`iters` Adam steps of Gaussian NLL on the window (inputs rows[:-1], targets rows[1:, 0])."""
        x = features[:-1].unsqueeze(0)
        target = features[1:, 0].unsqueeze(0)
        with torch.enable_grad():
            for _ in range(iters):
                self.optimizer.zero_grad(set_to_none=True)
                y = self.head(self.gru(x)[0])
                mu, logvar = y[..., 0], y[..., 1].clamp(_LOGVAR_MIN, _LOGVAR_MAX)
                nll = 0.5 * (logvar + (target - mu).pow(2) * torch.exp(-logvar))
                nll.mean().backward()
                self.optimizer.step()

    def tensors(self) -> list[torch.Tensor]:
        """The weights and Adam's state."""
        state = self.optimizer.state.values()
        return [*self.params, *(v for st in state for v in st.values() if isinstance(v, torch.Tensor))]

    def named_params(self) -> list[tuple[str, nn.Parameter]]:
        return [*((f"gru.{n}", p) for n, p in self.gru.named_parameters())] + [
            (f"head.{n}", p) for n, p in self.head.named_parameters()
        ]

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"generator_state": self.generator.get_state().clone()}
        state.update({f"param.{name}": p.detach().clone() for name, p in self.named_params()})
        for i, p in enumerate(self.params):
            for key, value in self.optimizer.state.get(p, {}).items():
                state[f"adam.{i}.{key}"] = value.clone() if isinstance(value, torch.Tensor) else value
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.inference_mode(False), torch.no_grad():
            for name, p in self.named_params():
                p.copy_(torch.as_tensor(state[f"param.{name}"], dtype=torch.float32))
            moments: dict[int, dict[str, Any]] = {}
            for key, value in state.items():
                if key.startswith("adam."):
                    _, index, sub = key.split(".", 2)
                    copy = value.clone() if isinstance(value, torch.Tensor) else value
                    moments.setdefault(int(index), {})[sub] = copy
            groups = self.optimizer.state_dict()["param_groups"]
            self.optimizer.load_state_dict({"state": moments, "param_groups": groups})
            self.generator.set_state(torch.as_tensor(state["generator_state"], dtype=torch.uint8).clone())


class LossForecaster:
    """Online GRU forecaster of the training loss: :meth:`observe` once per optimizer step,
    :meth:`forecast` when needed; :meth:`errors` scores it against the baselines."""

    def __init__(
        self,
        hidden_size: int = 16,
        window: int = 32,
        learning_rate: float = 1e-2,
        train_iters: int = 2,
        ema_beta: float = 0.9,
        min_history: int = 8,
        seed: int = 0,
        train_every: int = 1,
    ) -> None:
        check_int("hidden_size", hidden_size, 1)
        check_int("window", window, 2)
        check_float("learning_rate", learning_rate, 0.0, 1e6, low_open=True)
        check_int("train_iters", train_iters, 0)
        check_int("train_every", train_every, 1)
        check_float("ema_beta", ema_beta, 0.0, 1.0, high_open=True)
        check_int("min_history", min_history, 2)
        self.hidden_size, self.window, self.seed = int(hidden_size), int(window), int(seed)
        self.learning_rate, self.ema_beta = float(learning_rate), float(ema_beta)
        self.train_iters, self.min_history = int(train_iters), int(min_history)
        self.train_every = int(train_every)  # train on every n-th step only: the per-step cost is the point
        self.model = GaussianGRU(self.hidden_size, self.learning_rate, self.seed)
        # Feature rows of the last `window + 1` accepted steps; row i's target is row i+1's normalised change.
        self.features = torch.zeros(0, _INPUT_SIZE, dtype=torch.float32)
        self.levels = LossLevels()
        self.scores = OneStepScores()
        self.rejected = 0  # non-finite losses ignored so far

    @property
    def num_observed(self) -> int:
        """Number of accepted (finite) losses so far."""
        return self.levels.count

    def observe(self, loss: float, learning_rate: float, grad_norm: float | None, phase_index: int) -> None:
        """Score the pending forecasts against ``loss``, append it and train. A non-finite loss is rejected
        and drops the pending forecasts (the next finite loss would be two steps ahead)."""
        phase = int(phase_index)
        if not 0 <= phase < _NUM_PHASES:
            raise ValueError(f"phase_index must be in [0, {_NUM_PHASES - 1}], got {phase_index}")
        loss = float(loss)
        if not math.isfinite(loss):
            self.rejected += 1
            self.scores.pending = None
            logger.debug("LossForecaster: rejected non-finite loss %r", loss)
            return
        self.scores.score(loss)
        levels = self.levels
        row = levels.append(loss, float(learning_rate), grad_norm, phase, self.ema_beta, self.window)
        with torch.inference_mode(False), torch.autocast("cpu", enabled=False):
            self.features = torch.cat([self.features, row], dim=0)[-(self.window + 1) :]
            due = levels.count % self.train_every == 0
            if self.features.shape[0] >= 2 and self.train_iters > 0 and due:
                self.model.train(self.features, self.train_iters)
            if levels.count >= self.min_history:
                with torch.no_grad():
                    mu = float(self.model.step(self.features[-self.window :])[0].item())
                self.scores.pending = [levels.last_loss + mu * levels.scale, levels.last_loss, levels.ema]

    def forecast(self, horizon: int) -> LossForecast:
        """Trusted: the GRU rolled out autoregressively, ``std`` from the summed variances. Else the best
        baseline held constant, ``std`` from its measured error growing like sqrt(k)."""
        check_int("horizon", horizon, 1)
        if self.levels.count == 0:
            raise RuntimeError("LossForecaster.forecast() needs at least one observed finite loss")
        last = self.levels.last_loss
        sqrt_k = [math.sqrt(k) for k in range(1, horizon + 1)]
        if self.levels.count < self.min_history:
            base = self.levels.recent_change_std()
            return LossForecast(mean=[last] * horizon, std=[base * s for s in sqrt_k], source="last_value")
        if self.trusted:
            return self._gru_forecast(horizon)
        errs, scored = self.errors(), self.scores.scored
        if scored > 0 and errs["ema_mae"] < errs["last_value_mae"]:
            source, value, mae = "ema", self.levels.ema, errs["ema_mae"]
        else:
            source, value, mae = "last_value", last, errs["last_value_mae"]
        base = mae * _GAUSS_MAE_TO_STD if scored > 0 else self.levels.recent_change_std()
        base = max(base, _scale_floor(last))
        return LossForecast(mean=[value] * horizon, std=[base * s for s in sqrt_k], source=source)

    def next_loss(self) -> float | None:
        """One-step forecast mean, reusing the GRU's from `observe` (not paid twice); None before any loss."""
        if self.levels.count == 0:
            return None
        pending = self.scores.pending
        if self.levels.count >= self.min_history and self.trusted and pending is not None:
            return pending[0]
        return self.forecast(1).mean[0]

    def _gru_forecast(self, horizon: int) -> LossForecast:
        levels = self.levels
        scale = levels.usable_scale()
        means: list[float] = []
        stds: list[float] = []
        with torch.inference_mode(False), torch.no_grad(), torch.autocast("cpu", enabled=False):
            mu_t, logvar_t, h = self.model.step(self.features[-self.window :])
            loss, ema, var_sum = levels.last_loss, levels.ema, 0.0
            for k in range(horizon):
                mu, var = float(mu_t.item()), math.exp(float(logvar_t.item()))
                loss = loss + mu * scale
                var_sum += var
                means.append(loss)
                stds.append(max(scale * math.sqrt(var_sum), _scale_floor(loss)))
                if k + 1 == horizon:
                    break
                ema = self.ema_beta * ema + (1.0 - self.ema_beta) * loss
                row = _row(
                    _clip(mu),
                    _clip((loss - ema) / scale),
                    levels.last_lr_rel,
                    levels.last_gn_rel,
                    levels.last_gn_missing,
                    levels.last_phase,
                )
                mu_t, logvar_t, h = self.model.step(row, h)
        return LossForecast(mean=means, std=stds, source="gru")

    def errors(self) -> dict[str, float]:
        """Running mean absolute one-step errors (NaN before any scored step) and the scored-step count."""
        return self.scores.errors()

    @property
    def trusted(self) -> bool:
        """True when at least ``min_history`` steps were scored and the GRU beats both baselines."""
        if self.scores.scored < self.min_history:
            return False
        e = self.errors()
        return e["gru_mae"] < min(e["last_value_mae"], e["ema_mae"])

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor it holds: weights, Adam state and the feature history (all on the CPU)."""
        return [*self.model.tensors(), self.features]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def state_dict(self) -> dict[str, Any]:
        """Flat dict of tensors (for safetensors) and JSON-able scalars; continues bit-identically."""
        return {
            **{f"config.{key}": getattr(self, key) for key in (*_CONFIG, "seed")},
            **self.model.state_dict(),
            "features": self.features.clone(),
            "rejected": self.rejected,
            **asdict(self.levels),
            **asdict(self.scores),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; the configuration must match this instance's."""
        for key in (*_CONFIG, "seed"):
            if state[f"config.{key}"] != getattr(self, key):
                raise ValueError(
                    f"state_dict config.{key}={state[f'config.{key}']!r} != {getattr(self, key)!r}"
                )
        self.model.load_state_dict(state)
        with torch.inference_mode(False):
            features = torch.as_tensor(state["features"], dtype=torch.float32)
            self.features = features.clone().reshape(-1, _INPUT_SIZE)
        self.rejected = int(state["rejected"])
        self.levels = LossLevels(**{f.name: _copied(state[f.name]) for f in fields(LossLevels)})
        self.scores = OneStepScores(**{f.name: _copied(state[f.name]) for f in fields(OneStepScores)})


def _copied(value: Any) -> Any:
    """A saved value as the state holds it (lists copied, so the saved dict is not shared)."""
    return list(value) if isinstance(value, list | tuple) else value
