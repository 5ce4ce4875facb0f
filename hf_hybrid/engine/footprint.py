"""The engine's own tensor bytes, by where they live, now and at their largest.

Counting walks every buffer the engine holds, so it is done only after a step that may have changed
them (a wake-up, a phase's snapshot, a predicted write, a predictor's first updates): the engine marks
those, and `hybrid_stats()` reads the last count. The peak travels with the checkpoint, so a resumed
run reports what the uninterrupted one does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch


class MemoryMeter:
    """`current`/`peak`: {"device": bytes on an accelerator, "host": bytes in host memory}."""

    def __init__(self, tensors: Callable[[], Iterable[torch.Tensor]]) -> None:
        self._tensors = tensors
        self.current = self.measure()
        self.peak = dict(self.current)
        self.changed = False

    def measure(self) -> dict[str, int]:
        out = {"device": 0, "host": 0}
        for t in self._tensors():
            out["host" if t.device.type == "cpu" else "device"] += t.numel() * t.element_size()
        return out

    def update(self) -> None:
        """Count again (after a step marked `changed`, or whenever asked)."""
        self.current = self.measure()
        self.peak = {kind: max(self.peak[kind], n) for kind, n in self.current.items()}
        self.changed = False

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
        self.current = self.measure()
