"""The engine's own tensor bytes, by where they live, now and at their largest.

Counting walks every buffer, so it is done only when the layout (which buffers exist) changed or the
engine forces it. The peak travels with the checkpoint, so a resumed run reports what the uninterrupted
one does.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping

import torch


class MemoryMeter:
    """`current`/`peak`: {"device": bytes on an accelerator, "host": bytes in host memory}."""

    def __init__(
        self, tensors: Callable[[], Iterable[torch.Tensor]], layout: Callable[[], Hashable] | None = None
    ) -> None:
        """`layout()`: a cheap summary of which buffers exist; a count is due when it changes."""
        self._tensors = tensors
        self._layout = layout or (lambda: None)
        self._counted = self._layout()
        self.current = self.measure()
        self.peak = dict(self.current)

    def measure(self) -> dict[str, int]:
        out = {"device": 0, "host": 0}
        for t in self._tensors():
            out["host" if t.device.type == "cpu" else "device"] += t.numel() * t.element_size()
        return out

    def due(self) -> bool:
        """Have buffers come or gone since the last count?"""
        return self._layout() != self._counted

    def update(self) -> None:
        """Count again (when `due`, or whenever asked)."""
        self._counted = self._layout()
        self.current = self.measure()
        self.peak = {kind: max(self.peak[kind], n) for kind, n in self.current.items()}

    def stats(self) -> dict[str, int]:
        return {
            "engine_bytes": sum(self.current.values()),
            "engine_device_bytes": self.current["device"],
            "engine_host_bytes": self.current["host"],
            "engine_peak_bytes": sum(self.peak.values()),
            "engine_peak_device_bytes": self.peak["device"],
            "engine_peak_host_bytes": self.peak["host"],
        }

    def merge_peak(self, peak: Mapping[str, int]) -> None:
        """Take an earlier engine's peak into this one's (a restarted engine carries on the run)."""
        self.peak = {kind: max(n, int(peak.get(kind, 0))) for kind, n in self.peak.items()}

    def state_dict(self) -> dict[str, int]:
        return dict(self.peak)

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.peak = {kind: int(n) for kind, n in state.items()}
        self._counted = self._layout()
        self.current = self.measure()
