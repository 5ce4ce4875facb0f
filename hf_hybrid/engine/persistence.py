"""What a `HybridEngine` saves, and how a saved engine loads back: its parts' own `state_dict`s plus the
few values the engine keeps itself. The format (JSON and tensors, split) and the fit checks are in
`state.py`.

With sharded parameters the tensors are this rank's shards and `sharding` records the world size and
the rank: each rank saves its own state, and it loads back only on the same rank of the same world size
(resharding a predictor's buffers or a snapshot is not supported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .alarm import DivergenceLevel
from .state import FORMAT_VERSION, describe_unloadable, parameter_fingerprint

if TYPE_CHECKING:
    from .engine import HybridEngine

# The components that checkpoint themselves, by their key in the state, in the order they are restored
# (the predict phases' keys are "bandit" and "phase").
PARTS = ("controller", "watch", "losses", "monitor", "store", "corrector", "guard", "counters", "spike_guard")
OPTIONAL_PARTS = ("spike_guard",)  # absent from states saved before it existed: it starts afresh


def engine_state(engine: HybridEngine) -> dict[str, Any]:
    """Everything needed to continue exactly, mid-phase included (tensors and plain values)."""
    if engine.plan is not None:
        raise RuntimeError("cannot save the engine in the middle of an optimizer step")
    # the spike guard's copies start again from the state being saved, as a resumed run's do
    engine.spike_guard.rebase(engine.step_number)
    return {
        "format_version": FORMAT_VERSION,
        "config": engine.config.fingerprint(),
        "parameters": parameter_fingerprint(engine.params),
        **{name: getattr(engine, name).state_dict() for name in PARTS},
        **engine.phases.state_dict(),
        "steps_since_real": engine.steps_since_real,
        "last_level": int(engine.last_level),
        "last_predicted_loss": engine.losses.predicted,
        "last_measured_loss": engine.losses.measured,
        "max_confidence": engine.max_confidence,
        "seconds": engine.seconds,
        "timing": engine.timer.state_dict(),
        "peak_memory": engine.meter.state_dict(),
        **({"sharding": engine.shards.describe()} if engine.shards.sharded else {}),
    }


def load_engine_state(engine: HybridEngine, state: dict[str, Any]) -> None:
    """Restore `engine_state`'s output; refuses a state of another configuration or model."""
    problem = describe_unloadable(state, engine.config, engine.params, engine.shards.describe())
    if problem:
        raise ValueError(problem)
    for name in PARTS:
        if name in state or name not in OPTIONAL_PARTS:
            getattr(engine, name).load_state_dict(state[name])
    engine.phases.load_state_dict(state)
    engine.steps_since_real = int(state["steps_since_real"])
    engine.last_level = DivergenceLevel(int(state["last_level"]))
    engine.losses.restore_last(state["last_predicted_loss"], state["last_measured_loss"])
    engine.max_confidence = float(state["max_confidence"])
    engine.timer.load_state_dict(state.get("timing"))
    engine.meter.load_state_dict(state["peak_memory"])
    engine.plan = None
