"""Where the spike guard's copies live: the first storage that fits the budget, and why."""

from __future__ import annotations

import torch

from hf_hybrid.guard_storage import MIB, choose_storage, copy_spacing, memory_budget, optimizer_state_bytes

WEIGHTS, STATE = 100 * MIB, 200 * MIB  # a full fine-tune with Adam: the two moments, twice the weights


def test_host_copies_when_they_fit():
    plan = choose_storage("auto", WEIGHTS, STATE, budget=1000 * MIB, saves_checkpoints=False)
    assert plan.storage == "host" and plan.copy_bytes == 600 * MIB
    assert "600.0 MiB of host memory (budget 1000 MiB)" in plan.line()


def test_copies_are_spaced_by_their_bytes_alone():
    """Up to `spacing_mb` every `every` steps, x2 per doubling beyond, x16 at most; 0 turns it off. The
    arena's full fine-tunes: the decoder's 36 MiB copy every 10 steps, MiniLM's 260 MiB every 40."""
    sizes = (36, 128, 129, 256, 260, 600, 10**5)
    assert [copy_spacing(mib * MIB, 10, 128) for mib in sizes] == [10, 10, 20, 20, 40, 80, 160]
    assert copy_spacing(10**5 * MIB, 10, 0) == 10
    plan = choose_storage("auto", WEIGHTS, STATE, 1000 * MIB, False, every=10, spacing_mb=128)
    assert plan.copy_every == 40
    assert "one copy (300.0 MiB) every 40 steps: 600.0 MiB of host memory" in plan.line()


def test_the_update_checks_copy_joins_host_copies_where_the_budget_holds_it():
    both = choose_storage(
        "auto", WEIGHTS, STATE, budget=1000 * MIB, saves_checkpoints=False, update_check=True
    )
    assert both.storage == "host" and both.update_check and both.copy_bytes == 700 * MIB
    assert "with the update check's copy (100.0 MiB" in both.reason
    tight = choose_storage(
        "auto", WEIGHTS, STATE, budget=650 * MIB, saves_checkpoints=False, update_check=True
    )
    assert tight.storage == "host" and not tight.update_check and tight.copy_bytes == 600 * MIB
    assert "no update check: its copy (100.0 MiB) exceeds the budget" in tight.reason
    weights = choose_storage(
        "auto", WEIGHTS, STATE, budget=300 * MIB, saves_checkpoints=False, update_check=True
    )
    assert weights.storage == "weights" and not weights.update_check


def test_weights_only_then_checkpoint_then_none_as_the_budget_shrinks():
    weights = choose_storage("auto", WEIGHTS, STATE, budget=300 * MIB, saves_checkpoints=True)
    assert weights.storage == "weights" and weights.copy_bytes == 200 * MIB
    assert weights.reason == "auto -> weights: host copies (600.0 MiB) exceed the budget"
    disk = choose_storage("auto", WEIGHTS, STATE, budget=100 * MIB, saves_checkpoints=True)
    assert disk.storage == "checkpoint" and disk.copy_bytes == 0
    none = choose_storage("auto", WEIGHTS, STATE, budget=100 * MIB, saves_checkpoints=False)
    assert none.storage == "none"
    assert "no checkpoint is saved (save_strategy='no') to restore from" in none.reason
    assert "nothing can be restored" in none.reason


def test_an_asked_storage_falls_back_only_to_cheaper_ones():
    asked = choose_storage("weights", WEIGHTS, STATE, budget=1000 * MIB, saves_checkpoints=False)
    assert asked.storage == "weights" and asked.reason == "as asked"
    too_big = choose_storage("host", WEIGHTS, STATE, budget=250 * MIB, saves_checkpoints=False)
    assert too_big.storage == "weights"


def test_budget_from_the_setting_or_a_share_of_available_memory():
    assert memory_budget(10.0) == 10 * MIB
    automatic = memory_budget(None)
    assert automatic is None or automatic > 0


def test_optimizer_state_is_counted_once_it_exists_and_estimated_before():
    param = torch.nn.Parameter(torch.zeros(1000))
    adam = torch.optim.AdamW([param], lr=0.1)
    assert optimizer_state_bytes(adam, [param]) == 2 * 4000  # estimated: Adam's two moments
    param.grad = torch.ones(1000)
    adam.step()
    counted = optimizer_state_bytes(adam, [param])
    assert 8000 <= counted <= 8000 + 8  # the two moments and the step counter
    sgd = torch.optim.SGD([param], lr=0.1)
    assert optimizer_state_bytes(sgd, [param]) == 4000
