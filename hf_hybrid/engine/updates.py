"""The real update of the trainable parameters: what the optimizer did since the engine last looked.

An fp32 copy of the parameters (or of the sampled coordinates) at the last observation; `take()` returns
the update per step since (averaged over unobserved steps) and refreshes it. Predicted updates and
rollbacks move the copy too, so they never count as the optimizer's. Every observed step runs it, so
the sampled copy is one flat buffer (`last`: views of it) and the full-size one uses `_foreach_*`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .predictor import Deltas
from .sample import CoordinateSample
from .sharding import local


class RealUpdateTracker:
    def __init__(self, params: Mapping[str, torch.Tensor], sample: CoordinateSample | None = None) -> None:
        self.params = dict(params)
        self.sample = sample
        self.unobserved_steps = 0  # real steps since the last take() that were not observed
        if sample is None:
            self.last = {name: self._view(name, p).float().clone() for name, p in self.params.items()}
            return
        self._counts = [sample.count(name) for name in self.params]
        self._device = local(next(iter(self.params.values()))).device
        self._flat = self._current()
        self.last = dict(zip(self.params, self._flat.split(self._counts), strict=True))

    def _view(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        tensor = local(tensor)
        return tensor.detach() if self.sample is None else self.sample.gather(name, tensor)

    def _current(self) -> torch.Tensor:
        """The sampled coordinates of all parameters now, in one flat fp32 tensor (on the first's device)."""
        views = [self._view(name, p) for name, p in self.params.items()]
        return torch.cat([v if v.device == self._device else v.to(self._device) for v in views]).float()

    def skip(self) -> None:
        """A real step happened and nobody looked: the next `take()` averages over it."""
        self.unobserved_steps += 1

    @torch.no_grad()
    def take(self) -> Deltas:
        """Real update per step since the last `take()` (fp32), and remember the current parameters."""
        steps = self.unobserved_steps + 1
        self.unobserved_steps = 0
        if self.sample is not None:
            current = self._current()
            delta = current - self._flat
            if steps > 1:
                delta.div_(steps)
            self._flat.copy_(current)
            return dict(zip(self.params, delta.split(self._counts), strict=True))
        names = list(self.params)
        current = [self._view(name, self.params[name]).float() for name in names]
        last = [self.last[name] for name in names]
        delta = torch._foreach_sub(current, last)
        if steps > 1:
            torch._foreach_div_(delta, steps)
        torch._foreach_copy_(last, current)
        return dict(zip(names, delta, strict=True))

    @torch.no_grad()
    def shift(self, applied: Mapping[str, torch.Tensor]) -> None:
        """A predicted update was written: it is not part of the next real update."""
        for name, delta in applied.items():
            buf = self.last[name]
            buf.add_(self._view(name, delta).to(buf.device))

    @torch.no_grad()
    def reset_to(self, snapshot: Mapping[str, torch.Tensor]) -> None:
        """The parameters were rolled back to `snapshot`."""
        for name, buf in self.last.items():
            buf.copy_(self._view(name, snapshot[name]))  # copy_ moves across devices itself

    def state_dict(self) -> dict[str, Any]:
        """Copies of the sampled buffers (views of one flat tensor, which safetensors would refuse)."""
        last = self.last if self.sample is None else {name: t.clone() for name, t in self.last.items()}
        return {"last": dict(last), "unobserved_steps": self.unobserved_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, buf in self.last.items():
            buf.copy_(state["last"][name])
        self.unobserved_steps = int(state["unobserved_steps"])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.last.values())
