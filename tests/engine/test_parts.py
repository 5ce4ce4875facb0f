"""The engine's state in one place (`parts.py`): what a checkpoint of the engine holds, and a saved engine
that continues exactly, mid-phase included."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from engine_loop import Loop, engine_config, equal

from hf_hybrid.engine.divergence import DivergenceMonitor
from hf_hybrid.engine.engine import HybridEngine
from hf_hybrid.engine.phases import Phase
from hf_hybrid.engine.state import join_state, split_state

# The keys of a saved engine: the checkpoint format (`state.FORMAT_VERSION`) a resumed run reads.
STATE_KEYS = {
    "format_version", "config", "parameters", "controller", "watch", "losses", "monitor", "store",
    "corrector", "guard", "counters", "spike_guard", "bandit", "phase", "steps_since_real", "last_level",
    "last_predicted_loss", "last_measured_loss", "max_confidence", "seconds", "timing", "peak_memory",
}  # fmt: skip


def _mid_phase() -> Loop:
    loop = Loop(engine_config())
    loop.run_until(lambda lp: lp.engine.controller.phase is Phase.PREDICT and lp.engine.steps_since_real >= 2)
    return loop


def _through_a_checkpoint(state: dict) -> dict:
    """The state as a checkpoint carries it: JSON, and the tensors apart."""
    tree, tensors = split_state(state)
    return join_state(json.loads(json.dumps(tree)), {k: v.clone() for k, v in tensors.items()})


def test_a_saved_engine_continues_exactly_mid_phase() -> None:
    loop = _mid_phase()
    state = loop.engine.state_dict()
    assert set(state) == STATE_KEYS and state["phase"] is not None and state["steps_since_real"] >= 2
    resumed = Loop(engine_config())  # the same data; weights, optimizer and engine from the checkpoint
    resumed.model.load_state_dict(loop.model.state_dict())
    resumed.opt.load_state_dict(copy.deepcopy(loop.opt.state_dict()))  # torch shares the tensors
    resumed.engine.load_state_dict(_through_a_checkpoint(state))
    assert resumed.engine.phase == loop.engine.phase and equal(
        resumed.engine.guard.snapshot, loop.engine.guard.snapshot
    )
    loop.run(40)
    resumed.run(40)
    assert loop.phases(-40) == resumed.phases() and Phase.CORRECT in resumed.phases()
    assert equal(loop.params, resumed.params)
    assert loop.engine.stats() == resumed.engine.stats()


def test_a_state_of_another_configuration_or_model_is_refused() -> None:
    state = _mid_phase().engine.state_dict()
    with pytest.raises(ValueError, match="predictor"):
        Loop(engine_config(predictor="null")).engine.load_state_dict(state)
    other = HybridEngine({"w": torch.nn.Parameter(torch.ones(3))}, engine_config())
    with pytest.raises(ValueError, match="trainable parameters differ"):
        other.load_state_dict(state)


def test_the_engine_reads_and_writes_its_parts() -> None:
    loop = Loop(engine_config())
    engine = loop.engine
    assert engine.learner.parts is engine.parts is engine.wakefulness.parts is engine.phases.parts
    monitor = DivergenceMonitor(min_history=10**6)
    engine.monitor = monitor  # what the engine uses, saves and loads is the parts' own
    assert engine.parts.monitor is monitor
    loop.run(12)
    assert engine.parts.steps_since_real == engine.steps_since_real == 0
    assert engine.stats()["steps"] == engine.parts.counters.summary(0.0)["steps"] == 12


def test_a_restarted_engine_carries_on_the_accounting_only() -> None:
    loop = Loop(engine_config())
    loop.run(30)
    state = loop.engine.state_dict()
    fresh = HybridEngine(loop.params, engine_config())
    fresh.continue_accounting(state)
    stats = fresh.stats()
    assert stats["steps"] == 30 and stats["engine_peak_bytes"] >= loop.engine.stats()["engine_peak_bytes"]
    assert fresh.predictor.observed == 0 and fresh.controller.steps_decided == 0  # nothing it learnt
