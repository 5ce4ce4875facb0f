"""The real update of the trainable parameters: what the optimizer did since the engine last looked.

The tracker keeps an fp32 copy of the parameters as they were at the last observation (with a
`CoordinateSample`, of the sampled coordinates only: what the sleeping engine keeps). `take()` returns
the update per step since then (averaged over the real steps it was not asked about, which is how the
dormant engine observes only every n-th step) and refreshes the copy. Predicted updates and rollbacks
move the copy too (`shift`, `reset_to`), so they never count as something the optimizer did.
With sharded parameters everything here is per shard: the copy is of this rank's shard (`local`).
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
        self.last = {name: self._view(name, p).float().clone() for name, p in self.params.items()}
        self.unobserved_steps = 0  # real steps since the last take() that were not observed

    def _view(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        tensor = local(tensor)
        return tensor.detach() if self.sample is None else self.sample.gather(name, tensor)

    def skip(self) -> None:
        """A real step happened and nobody looked: the next `take()` averages over it."""
        self.unobserved_steps += 1

    @torch.no_grad()
    def take(self) -> Deltas:
        """Real update per step since the last `take()` (fp32), and remember the current parameters."""
        steps = self.unobserved_steps + 1
        delta = {}
        for name, p in self.params.items():
            current = self._view(name, p).float()
            delta[name] = current - self.last[name]
            if steps > 1:
                delta[name].div_(steps)
            self.last[name].copy_(current)
        self.unobserved_steps = 0
        return delta

    @torch.no_grad()
    def shift(self, applied: Mapping[str, torch.Tensor]) -> None:
        """A predicted update was written: it is not part of the next real update."""
        for name, delta in applied.items():
            self.last[name].add_(self._view(name, delta))

    @torch.no_grad()
    def reset_to(self, snapshot: Mapping[str, torch.Tensor]) -> None:
        """The parameters were rolled back to `snapshot`."""
        for name, buf in self.last.items():
            buf.copy_(self._view(name, snapshot[name]))

    def state_dict(self) -> dict[str, Any]:
        return {"last": dict(self.last), "unobserved_steps": self.unobserved_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, buf in self.last.items():
            buf.copy_(state["last"][name])
        self.unobserved_steps = int(state["unobserved_steps"])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.last.values())
