"""The engine's state in one place: its stateful parts, built once from the configuration, and the few
values the engine keeps itself; a checkpoint is their `state_dict`s (format and fit checks: `state.py`).
Sharded, each rank saves its own and loads back only on the same rank of the same world size.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .accounting import StepCounters
from .alarm import DivergenceLevel
from .config import EngineConfig
from .divergence import DivergenceMonitor
from .footprint import MemoryMeter
from .guard import ParameterGuard
from .loss_watch import LossWatch
from .phases import PhaseController
from .predictor import DeltaPredictor, resolve_predictor_name
from .residuals import Corrector, ResidualStore
from .sharding import ShardGroup
from .spike_guard import SpikeGuard
from .state import FORMAT_VERSION, describe_unloadable, parameter_fingerprint
from .timing import PartTimer, clock_for
from .watch import UpdateWatch

# The parts that checkpoint themselves, by their key in the state, in the order they are restored.
PARTS = ("controller", "watch", "losses", "monitor", "store", "corrector", "guard", "counters", "spike_guard")
OPTIONAL_PARTS = ("spike_guard",)  # absent from states saved before it existed: it starts afresh


@dataclass(eq=False)
class EngineParts:
    """Every stateful part of a `HybridEngine`, and the values it keeps itself between steps."""

    config: EngineConfig
    params: dict[str, torch.Tensor]
    shards: ShardGroup  # FSDP2's sharded DTensors, or none
    timer: PartTimer  # what the hybrid machinery costs, by part
    controller: PhaseController
    watch: UpdateWatch
    losses: LossWatch
    monitor: DivergenceMonitor
    store: ResidualStore
    corrector: Corrector
    counters: StepCounters
    guard: ParameterGuard
    spike_guard: SpikeGuard
    steps_since_real: int = 0  # predicted steps since the last real one (the next guess's horizon)
    last_level: DivergenceLevel = DivergenceLevel.NORMAL  # the worst alarm of the last step
    max_confidence: float = 0.0  # highest confidence measured after warmup (the summary's "why not")
    meter: MemoryMeter = field(init=False)  # the parts' own bytes, now and at their largest

    def __post_init__(self) -> None:
        self.meter = MemoryMeter(self.tensors, self.layout)

    @classmethod
    def build(
        cls,
        params: Mapping[str, torch.Tensor],
        config: EngineConfig,
        optimizer: torch.optim.Optimizer | None = None,
        predictor: DeltaPredictor | None = None,
        spike_guard: SpikeGuard | None = None,
    ) -> EngineParts:
        """Fresh parts for `params` (see `HybridEngine` for what the arguments mean)."""
        params = dict(params)
        shards = ShardGroup.of(params)
        timer = PartTimer(clock_for(params.values()))
        controller = PhaseController(config.schedule)
        watch = UpdateWatch(
            params,
            resolve_predictor_name(config.predictor, optimizer),
            config.predictor_kwargs,
            optimizer,
            config.seed,
            may_sleep=may_sleep(config),
            predictor=predictor,
            shards=shards,
        )
        counters = StepCounters()
        return cls(
            config=config,
            params=params,
            shards=shards,
            timer=timer,
            controller=controller,
            watch=watch,
            losses=LossWatch(config.seed, awake=watch.awake),
            monitor=DivergenceMonitor(sigma=config.divergence_sigma),
            store=ResidualStore(),
            corrector=Corrector(),
            counters=counters,
            guard=ParameterGuard(params, config.snapshot_device, shards, timer, counters),
            spike_guard=spike_guard or SpikeGuard.off(),
        )

    @property
    def awake(self) -> bool:
        """False while the engine sleeps: buffers for a sample of the coordinates, no loss forecaster."""
        return self.watch.awake

    def tensors(self) -> list[torch.Tensor]:
        parts = (self.watch, self.guard, self.losses, self.spike_guard)
        return [t for part in parts for t in part.tensors()]

    def layout(self) -> Hashable:
        """Which buffers exist (the memory meter counts again when this changes)."""
        return self.awake, self.guard.buffer_counts(), self.spike_guard.buffer_count()

    def state_dict(self) -> dict[str, Any]:
        """The parts' own states and the engine's values (tensors and plain values)."""
        return {
            "format_version": FORMAT_VERSION,
            "config": self.config.fingerprint(),
            "parameters": parameter_fingerprint(self.params),
            **{name: getattr(self, name).state_dict() for name in PARTS},
            "steps_since_real": self.steps_since_real,
            "last_level": int(self.last_level),
            "last_predicted_loss": self.losses.predicted,
            "last_measured_loss": self.losses.measured,
            "max_confidence": self.max_confidence,
            "seconds": self.timer.total,
            "timing": self.timer.state_dict(),
            "peak_memory": self.meter.state_dict(),
            **({"sharding": self.shards.describe()} if self.shards.sharded else {}),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict`'s output; refuses a state of another configuration or model."""
        problem = describe_unloadable(state, self.config, self.params, self.shards.describe())
        if problem:
            raise ValueError(problem)
        for name in PARTS:
            if name in state or name not in OPTIONAL_PARTS:
                getattr(self, name).load_state_dict(state[name])
        self.steps_since_real = int(state["steps_since_real"])
        self.last_level = DivergenceLevel(int(state["last_level"]))
        self.losses.restore_last(state["last_predicted_loss"], state["last_measured_loss"])
        self.max_confidence = float(state["max_confidence"])
        self.timer.load_state_dict(state.get("timing"))
        self.meter.load_state_dict(state["peak_memory"])

    def continue_accounting(self, state: Mapping[str, Any]) -> None:
        """Carry on a run's counters, time and peak bytes from its saved state, and nothing it learnt."""
        self.counters.load_state_dict(state["counters"])
        self.timer.load_state_dict(state.get("timing"))
        self.meter.merge_peak(state["peak_memory"])


def may_sleep(config: EngineConfig) -> bool:
    """Not with `dormant_every=1`, nor scripted (its phases open whatever the confidence, full-size)."""
    s = config.schedule
    return s.confidence_threshold > 0 and config.dormant_every > 1 and s.script is None
