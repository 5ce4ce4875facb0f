"""The loss forecaster ("RSSM-lite" in the seed): a tiny GRU that forecasts the training loss online.

The model is trained online, one optimizer step at a time, on the recent loss history and forecasts the
loss over the next ``horizon`` steps with a Gaussian predictive uncertainty. It keeps an honest score of
its own one-step-ahead error against two naive baselines (last value, EMA of losses) measured on the same
steps, and only calls itself :attr:`LossForecaster.trusted` when it beats both.

Design notes:

* Loss levels drift over training, so the GRU models normalised quantities: it predicts the next step's
  *change* of loss divided by a running scale (EMA of absolute loss changes). Its inputs per step are the
  normalised change, the normalised deviation of the loss from its EMA (lets it learn mean reversion of
  noise), the log learning rate relative to its running value, the log grad norm relative to its running
  value (or a missing flag), and a one-hot of the training phase.
* The output is Gaussian (mean, clamped log-variance) trained with the Gaussian negative log-likelihood so
  the forecast ``std`` is a calibrated-ish spread rather than a made-up number.
* Everything runs on CPU in float32 with a private ``torch.Generator``: the model is tiny, CPU keeps it
  bit-identical on every distributed rank, and the global torch RNG is never touched (the trainer relies on
  RNG streams identical to the plain Trainer). Grad mode, inference mode and CPU autocast of the caller are
  neither relied upon nor changed.

This module is plain PyTorch + stdlib and must never import transformers.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
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


@dataclass(frozen=True)
class LossForecast:
    """Forecast of the training loss for steps ``t+1 .. t+horizon``.

    ``mean`` and ``std`` have one entry per step; ``std`` is always > 0. ``source`` is ``"gru"`` when the
    model is trusted, otherwise the name of the best baseline (``"last_value"`` or ``"ema"``).
    """

    mean: list[float]
    std: list[float]
    source: str


def _scale_floor(loss: float) -> float:
    """Smallest usable scale: keeps divisions finite when the loss is exactly constant."""
    return 1e-8 + 1e-6 * abs(loss)


def _clip(x: float) -> float:
    return max(-_FEATURE_CLIP, min(_FEATURE_CLIP, x))


class LossForecaster:
    """Online GRU forecaster of the training loss with honest self-scoring against naive baselines.

    Call :meth:`observe` once per optimizer step and :meth:`forecast` whenever a forecast is needed.
    :meth:`errors` reports the running (exponentially weighted, ~100-step memory, bias corrected) mean
    absolute one-step-ahead errors of the GRU and both baselines, all scored on exactly the same steps:
    a recent-weighted mean follows regime changes of training instead of being dominated by the early,
    untrained phase of the GRU.
    """

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
        self.hidden_size = int(hidden_size)
        self.window = int(window)
        self.learning_rate = float(learning_rate)
        self.train_iters = int(train_iters)
        self.train_every = int(train_every)  # train on every n-th step only: the per-step cost is the point
        self.ema_beta = float(ema_beta)
        self.min_history = int(min_history)
        self.seed = int(seed)

        self._build_model()

        # Feature rows of the last `window + 1` accepted steps; row i's target is row i+1's normalised change.
        self._features = torch.zeros(0, _INPUT_SIZE, dtype=torch.float32)
        self._losses: list[float] = []  # last `window` accepted losses (python floats, exact)
        self._count = 0  # accepted losses so far
        self._rejected = 0
        self._last_loss = 0.0
        self._ema = 0.0
        self._scale = 0.0  # 0.0 until the first loss change is seen
        self._log_lr_ema: float | None = None
        self._log_gn_ema: float | None = None
        self._last_lr_rel = 0.0
        self._last_gn_rel = 0.0
        self._last_gn_missing = 1.0
        self._last_phase = 0
        # One-step forecasts made at the previous step, scored against the next accepted loss.
        self._pending: tuple[float, float, float] | None = None  # (gru, last_value, ema)
        # Exponentially weighted absolute errors: acc / norm is the bias-corrected mean.
        self._err_acc = [0.0, 0.0, 0.0]
        self._err_norm = 0.0
        self._scored = 0

    def _build_model(self) -> None:
        """The GRU and its head, initialised from the forecaster's own seeded generator, and their Adam."""
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(self.seed)
        with torch.inference_mode(False), torch.no_grad():
            # Built on the meta device and materialised uninitialised: nn.Module constructors would draw
            # their default init from the *global* RNG, which must stay untouched.
            self._gru = nn.GRU(
                _INPUT_SIZE, self.hidden_size, batch_first=True, dtype=torch.float32, device="meta"
            ).to_empty(device="cpu")
            self._head = nn.Linear(self.hidden_size, 2, dtype=torch.float32, device="meta").to_empty(
                device="cpu"
            )
            bound = 1.0 / math.sqrt(self.hidden_size)
            for p in self._gru.parameters():
                p.uniform_(-bound, bound, generator=self._generator)
            # Small output layer: the untrained model predicts "no change" (= last value) with unit spread.
            self._head.weight.uniform_(-0.01, 0.01, generator=self._generator)
            self._head.bias.zero_()
        self._params: list[nn.Parameter] = list(self._gru.parameters()) + list(self._head.parameters())
        self._optimizer = torch.optim.Adam(self._params, lr=self.learning_rate)

    # ------------------------------------------------------------------ observing
    def observe(self, loss: float, learning_rate: float, grad_norm: float | None, phase_index: int) -> None:
        """Record one optimizer step (mean batch ``loss``, ``learning_rate`` used, ``grad_norm`` or None).

        First scores the one-step forecasts made at the previous step against ``loss``, then appends it and
        runs ``train_iters`` Adam steps on the recent window. A non-finite loss is rejected (counted in
        ``rejected``, not stored, not trained on) and the pending forecasts are dropped, since the next
        finite loss would be two steps ahead and scoring it as one-step would be dishonest.
        """
        phase = int(phase_index)
        if not 0 <= phase < _NUM_PHASES:
            raise ValueError(f"phase_index must be in [0, {_NUM_PHASES - 1}], got {phase_index}")
        loss = float(loss)
        if not math.isfinite(loss):
            self._rejected += 1
            self._pending = None
            logger.debug("LossForecaster: rejected non-finite loss %r", loss)
            return

        if self._pending is not None:
            b = _ERROR_BETA
            for i, pred in enumerate(self._pending):
                self._err_acc[i] = b * self._err_acc[i] + (1.0 - b) * abs(loss - pred)
            self._err_norm = b * self._err_norm + (1.0 - b)
            self._scored += 1
            self._pending = None

        row = self._append(loss, float(learning_rate), grad_norm, phase)
        with torch.inference_mode(False), torch.autocast("cpu", enabled=False):
            self._features = torch.cat([self._features, row], dim=0)[-(self.window + 1) :]
            due = self._count % self.train_every == 0
            if self._features.shape[0] >= 2 and self.train_iters > 0 and due:
                self._train()
            if self._count >= self.min_history:
                with torch.no_grad():
                    mu, _ = self._one_step_from_window()
                gru_pred = self._last_loss + mu * self._scale
                self._pending = (gru_pred, self._last_loss, self._ema)

    def _append(self, loss: float, learning_rate: float, grad_norm: float | None, phase: int) -> torch.Tensor:
        """Update running statistics with an accepted loss and return its feature row (1, input_size)."""
        if self._count == 0:
            d = 0.0
            self._ema = loss
            self._scale = 0.0
        else:
            diff = loss - self._last_loss
            floor = _scale_floor(loss)
            if self._scale <= 0.0:
                self._scale = max(abs(diff), floor)
            d = _clip(diff / max(self._scale, floor))
            self._scale = max(_SCALE_BETA * self._scale + (1.0 - _SCALE_BETA) * abs(diff), floor)
            self._ema = self.ema_beta * self._ema + (1.0 - self.ema_beta) * loss
        self._last_loss = loss
        self._count += 1
        self._losses.append(loss)
        if len(self._losses) > self.window:
            del self._losses[0]
        scale = self._scale if self._scale > 0.0 else _scale_floor(loss)
        dev = _clip((loss - self._ema) / scale)

        log_lr = math.log(max(learning_rate, 1e-12)) if math.isfinite(learning_rate) else None
        if log_lr is None:
            lr_rel = 0.0
        else:
            if self._log_lr_ema is None:
                self._log_lr_ema = log_lr
            lr_rel = _clip(log_lr - self._log_lr_ema)
            self._log_lr_ema = _LOG_EMA_BETA * self._log_lr_ema + (1.0 - _LOG_EMA_BETA) * log_lr

        gn_ok = grad_norm is not None and math.isfinite(float(grad_norm)) and float(grad_norm) > 0.0
        if gn_ok:
            log_gn = math.log(float(grad_norm))  # type: ignore[arg-type]
            if self._log_gn_ema is None:
                self._log_gn_ema = log_gn
            gn_rel = _clip(log_gn - self._log_gn_ema)
            self._log_gn_ema = _LOG_EMA_BETA * self._log_gn_ema + (1.0 - _LOG_EMA_BETA) * log_gn
            gn_missing = 0.0
        else:
            gn_rel, gn_missing = 0.0, 1.0
        self._last_lr_rel, self._last_gn_rel, self._last_gn_missing = lr_rel, gn_rel, gn_missing
        self._last_phase = phase
        return self._make_row(d, dev, lr_rel, gn_rel, gn_missing, phase)

    @staticmethod
    def _make_row(
        d: float, dev: float, lr_rel: float, gn_rel: float, gn_missing: float, phase: int
    ) -> torch.Tensor:
        values = [d, dev, lr_rel, gn_rel, gn_missing] + [0.0] * _NUM_PHASES
        values[5 + phase] = 1.0
        with torch.inference_mode(False):
            return torch.tensor([values], dtype=torch.float32)

    # ------------------------------------------------------------------ model
    def _heads(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self._head(out)
        return y[..., 0], y[..., 1].clamp(_LOGVAR_MIN, _LOGVAR_MAX)

    def _train(self) -> None:
        """``train_iters`` Adam steps of Gaussian NLL on the window: inputs rows[:-1], targets rows[1:, 0].

        Each step is trained as one sequence from a zero hidden state (truncated BPTT over the window).
        """
        x = self._features[:-1].unsqueeze(0)
        target = self._features[1:, 0].unsqueeze(0)
        with torch.enable_grad():
            for _ in range(self.train_iters):
                self._optimizer.zero_grad(set_to_none=True)
                out, _ = self._gru(x)
                mu, logvar = self._heads(out)
                nll = 0.5 * (logvar + (target - mu).pow(2) * torch.exp(-logvar))
                nll.mean().backward()
                self._optimizer.step()

    def _one_step_from_window(self) -> tuple[float, torch.Tensor]:
        """Normalised mean change for the next step from the last ``window`` rows (no grad)."""
        out, h = self._gru(self._features[-self.window :].unsqueeze(0))
        mu, _ = self._heads(out[:, -1])
        return float(mu.item()), h

    # ------------------------------------------------------------------ forecasting
    def forecast(self, horizon: int) -> LossForecast:
        """Forecast the loss for the next ``horizon`` steps.

        Trusted: autoregressive roll-out of the GRU (predicted mean change fed back as the next input, lr,
        grad norm and phase held at their last values), ``std`` from the accumulated predicted variances.
        Not trusted (or fewer than ``min_history`` losses): the best baseline held constant, with ``std``
        from its measured error (or, early on, from the spread of recent loss changes) growing like sqrt(k).
        """
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
        if self._count == 0:
            raise RuntimeError("LossForecaster.forecast() needs at least one observed finite loss")
        last = self._last_loss
        sqrt_k = [math.sqrt(k) for k in range(1, horizon + 1)]
        if self._count < self.min_history:
            base = self._recent_change_std()
            return LossForecast(mean=[last] * horizon, std=[base * s for s in sqrt_k], source="last_value")
        if self.trusted:
            return self._gru_forecast(horizon)
        errs = self.errors()
        if self._scored > 0 and errs["ema_mae"] < errs["last_value_mae"]:
            source, value, mae = "ema", self._ema, errs["ema_mae"]
        else:
            source, value, mae = "last_value", last, errs["last_value_mae"]
        base = mae * _GAUSS_MAE_TO_STD if self._scored > 0 else self._recent_change_std()
        base = max(base, _scale_floor(last))
        return LossForecast(mean=[value] * horizon, std=[base * s for s in sqrt_k], source=source)

    def next_loss(self) -> float | None:
        """One-step forecast mean, without a roll-out: `observe` already computed the GRU's (this runs
        every optimizer step, so the GRU forward is not paid twice). None before any loss."""
        if self._count == 0:
            return None
        if self._count >= self.min_history and self.trusted and self._pending is not None:
            return self._pending[0]
        return self.forecast(1).mean[0]

    def _recent_change_std(self) -> float:
        """Spread of the recent one-step loss changes; a floor when there are too few."""
        losses = self._losses
        floor = max(1e-3 * abs(self._last_loss), 1e-6)
        if len(losses) < 3:
            return floor
        diffs = [b - a for a, b in zip(losses[:-1], losses[1:], strict=False)]
        m = sum(diffs) / len(diffs)
        var = sum((x - m) ** 2 for x in diffs) / (len(diffs) - 1)
        return max(math.sqrt(var), floor)

    def _gru_forecast(self, horizon: int) -> LossForecast:
        scale = self._scale if self._scale > 0.0 else _scale_floor(self._last_loss)
        means: list[float] = []
        stds: list[float] = []
        with torch.inference_mode(False), torch.no_grad(), torch.autocast("cpu", enabled=False):
            out, h = self._gru(self._features[-self.window :].unsqueeze(0))
            mu_t, logvar_t = self._heads(out[:, -1])
            loss, ema, var_sum = self._last_loss, self._ema, 0.0
            for k in range(horizon):
                mu, var = float(mu_t.item()), math.exp(float(logvar_t.item()))
                loss = loss + mu * scale
                var_sum += var
                means.append(loss)
                stds.append(max(scale * math.sqrt(var_sum), _scale_floor(loss)))
                if k + 1 == horizon:
                    break
                ema = self.ema_beta * ema + (1.0 - self.ema_beta) * loss
                row = self._make_row(
                    _clip(mu),
                    _clip((loss - ema) / scale),
                    self._last_lr_rel,
                    self._last_gn_rel,
                    self._last_gn_missing,
                    self._last_phase,
                )
                out, h = self._gru(row.unsqueeze(0), h)
                mu_t, logvar_t = self._heads(out[:, -1])
        return LossForecast(mean=means, std=stds, source="gru")

    # ------------------------------------------------------------------ scoring
    def errors(self) -> dict[str, float]:
        """Running mean absolute one-step errors (NaN before any scored step) and the scored-step count."""
        if self._err_norm > 0.0:
            gru, lv, ema = (a / self._err_norm for a in self._err_acc)
        else:
            gru = lv = ema = float("nan")
        return {"gru_mae": gru, "last_value_mae": lv, "ema_mae": ema, "scored_steps": self._scored}

    @property
    def trusted(self) -> bool:
        """True when at least ``min_history`` steps were scored and the GRU beats both baselines."""
        if self._scored < self.min_history:
            return False
        e = self.errors()
        return e["gru_mae"] < min(e["last_value_mae"], e["ema_mae"])

    @property
    def rejected(self) -> int:
        """Number of non-finite losses ignored so far."""
        return self._rejected

    @property
    def num_observed(self) -> int:
        """Number of accepted (finite) losses so far."""
        return self._count

    # ------------------------------------------------------------------ state
    def tensors(self) -> list[torch.Tensor]:
        """Every tensor it holds: weights, Adam state and the feature history (all on the CPU)."""
        state = [
            v for st in self._optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)
        ]
        return [*self._params, *state, self._features]

    def nbytes(self) -> int:
        """Bytes held in tensors: weights, Adam state and the feature history."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def state_dict(self) -> dict[str, Any]:
        """Flat dict of tensors and plain scalars/lists from which the model continues bit-identically.

        Tensor entries (weights, Adam moments/steps, feature history, generator state) can go to
        safetensors; the rest are JSON-serialisable Python scalars and lists.
        """
        state: dict[str, Any] = {
            "config.hidden_size": self.hidden_size,
            "config.window": self.window,
            "config.learning_rate": self.learning_rate,
            "config.train_iters": self.train_iters,
            "config.train_every": self.train_every,
            "config.ema_beta": self.ema_beta,
            "config.min_history": self.min_history,
            "config.seed": self.seed,
            "generator_state": self._generator.get_state().clone(),
            "features": self._features.clone(),
            "losses": list(self._losses),
            "count": self._count,
            "rejected": self._rejected,
            "last_loss": self._last_loss,
            "ema": self._ema,
            "scale": self._scale,
            "log_lr_ema": self._log_lr_ema,
            "log_gn_ema": self._log_gn_ema,
            "last_lr_rel": self._last_lr_rel,
            "last_gn_rel": self._last_gn_rel,
            "last_gn_missing": self._last_gn_missing,
            "last_phase": self._last_phase,
            "pending": list(self._pending) if self._pending is not None else None,
            "err_acc": list(self._err_acc),
            "err_norm": self._err_norm,
            "scored": self._scored,
        }
        for name, p in self._named_params():
            state[f"param.{name}"] = p.detach().clone()
        for i, p in enumerate(self._params):
            st = self._optimizer.state.get(p, {})
            for key, value in st.items():
                state[f"adam.{i}.{key}"] = value.clone() if isinstance(value, torch.Tensor) else value
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; the configuration must match this instance's."""
        for key in (
            "hidden_size",
            "window",
            "learning_rate",
            "train_iters",
            "train_every",
            "ema_beta",
            "min_history",
            "seed",
        ):
            if state[f"config.{key}"] != getattr(self, key):
                raise ValueError(
                    f"state_dict config.{key}={state[f'config.{key}']!r} != {getattr(self, key)!r}"
                )
        with torch.inference_mode(False), torch.no_grad():
            for name, p in self._named_params():
                p.copy_(torch.as_tensor(state[f"param.{name}"], dtype=torch.float32))
            opt_state: dict[int, dict[str, Any]] = {}
            for key, value in state.items():
                if key.startswith("adam."):
                    _, idx, sub = key.split(".", 2)
                    opt_state.setdefault(int(idx), {})[sub] = (
                        value.clone() if isinstance(value, torch.Tensor) else value
                    )
            sd = self._optimizer.state_dict()
            self._optimizer.load_state_dict({"state": opt_state, "param_groups": sd["param_groups"]})
            self._generator.set_state(torch.as_tensor(state["generator_state"], dtype=torch.uint8).clone())
            self._features = (
                torch.as_tensor(state["features"], dtype=torch.float32).clone().reshape(-1, _INPUT_SIZE)
            )
        self._losses = [float(x) for x in state["losses"]]
        self._count = int(state["count"])
        self._rejected = int(state["rejected"])
        self._last_loss = float(state["last_loss"])
        self._ema = float(state["ema"])
        self._scale = float(state["scale"])
        self._log_lr_ema = None if state["log_lr_ema"] is None else float(state["log_lr_ema"])
        self._log_gn_ema = None if state["log_gn_ema"] is None else float(state["log_gn_ema"])
        self._last_lr_rel = float(state["last_lr_rel"])
        self._last_gn_rel = float(state["last_gn_rel"])
        self._last_gn_missing = float(state["last_gn_missing"])
        self._last_phase = int(state["last_phase"])
        pending = state["pending"]
        self._pending = None if pending is None else (float(pending[0]), float(pending[1]), float(pending[2]))
        self._err_acc = [float(x) for x in state["err_acc"]]
        self._err_norm = float(state["err_norm"])
        self._scored = int(state["scored"])

    def _named_params(self) -> list[tuple[str, nn.Parameter]]:
        return [(f"gru.{n}", p) for n, p in self._gru.named_parameters()] + [
            (f"head.{n}", p) for n, p in self._head.named_parameters()
        ]
