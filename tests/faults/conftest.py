"""Fixtures of the fault suite: `invariants` (see fault_invariants.py) and the module's checkpoint loader."""

from __future__ import annotations

from typing import Any

import pytest
from fault_invariants import CheckpointLoader, Invariants

from hf_hybrid.engine.predictor import available_predictors, unregister_predictor


@pytest.fixture(scope="module")
def checkpoint_loader(tmp_path_factory: pytest.TempPathFactory) -> Any:
    loader = CheckpointLoader()
    yield loader
    loader.run(tmp_path_factory.mktemp("load-checkpoints"))


@pytest.fixture
def invariants(checkpoint_loader: CheckpointLoader, request: pytest.FixtureRequest) -> Any:
    inv = Invariants(checkpoint_loader, request.node.nodeid)
    yield inv
    if not inv.verified and inv.trainers:
        inv.verify()


@pytest.fixture(autouse=True)
def _forget_registered_predictors() -> Any:
    """Predictors a test registers (harness.fault_predictor) do not outlive it."""
    before = set(available_predictors())
    yield
    for name in set(available_predictors()) - before:
        unregister_predictor(name)
