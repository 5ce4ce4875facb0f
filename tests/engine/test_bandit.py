"""Tests for the predict-horizon bandit."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hf_hybrid.engine.bandit import HorizonBandit, default_arms, phase_reward
from hf_hybrid.engine.state import join_state, split_state


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (2, 16, [2, 4, 8, 16]),
        (3, 20, [3, 4, 8, 16, 20]),
        (4, 4, [4]),
        (1, 1, [1]),
        (1, 8, [1, 2, 4, 8]),
        (5, 7, [5, 7]),
        (6, 9, [6, 8, 9]),
    ],
)
def test_default_arms(lo: int, hi: int, expected: list[int]) -> None:
    assert default_arms(lo, hi) == expected


@pytest.mark.parametrize(
    ("lo", "hi", "name"), [(0, 4, "min_steps"), (5, 4, "max_steps"), (2.0, 4, "min_steps")]
)
def test_default_arms_validation(lo: object, hi: object, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        default_arms(lo, hi)  # type: ignore[arg-type]


def test_phase_reward_formula() -> None:
    assert phase_reward(4, 3, False, 1.0) == pytest.approx(4 / 8)
    assert phase_reward(4, 3, False, 0.5) == pytest.approx(0.5 * 4 / 8)
    assert phase_reward(16, 0, False, 1.0) == pytest.approx(16 / 17)


@pytest.mark.parametrize(
    ("predicted", "full", "rolled_back", "skill", "expected"),
    [
        (4, 3, True, 1.0, 0.0),  # rolled back: nothing saved
        (0, 3, False, 1.0, 0.0),  # nothing predicted
        (4, 3, False, -2.5, 0.0),  # worse than not predicting clamps to 0
        (4, 3, False, -math.inf, 0.0),
        (4, 3, False, 0.0, 0.0),
        (4, 3, False, 1.7, 0.5),  # skill clamps to 1
        (4, 3, False, math.inf, 0.5),
        (4, 3, False, math.nan, 0.0),
    ],
)
def test_phase_reward_edges(
    predicted: int, full: int, rolled_back: bool, skill: float, expected: float
) -> None:
    reward = phase_reward(predicted, full, rolled_back, skill)
    assert reward == pytest.approx(expected)
    assert 0.0 <= reward <= 1.0


@pytest.mark.parametrize(("predicted", "full", "name"), [(-1, 0, "predicted_steps"), (1, -1, "full_steps")])
def test_phase_reward_validation(predicted: int, full: int, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        phase_reward(predicted, full, False, 1.0)


def test_unplayed_arms_first_in_ascending_order() -> None:
    bandit = HorizonBandit([16, 2, 8, 4])
    order = []
    for _ in range(4):
        arm = bandit.select()
        order.append(arm)
        bandit.update(arm, 0.0)
    assert order == [2, 4, 8, 16]


def _play(bandit: HorizonBandit, means: dict[int, float], rounds: int, seed: int) -> list[int]:
    """Bernoulli rewards with the given means, drawn from their own seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    chosen = []
    for _ in range(rounds):
        arm = bandit.select()
        reward = float(torch.rand((), generator=gen) < means[arm])
        bandit.update(arm, reward)
        chosen.append(arm)
    return chosen


def test_converges_to_best_arm() -> None:
    means = {2: 0.2, 4: 0.35, 8: 0.7, 16: 0.4}
    bandit = HorizonBandit(list(means), seed=1)
    chosen = _play(bandit, means, rounds=1500, seed=123)
    stats = bandit.stats()
    assert max(stats, key=lambda arm: stats[arm]["pulls"]) == "8"
    assert stats["8"]["pulls"] > 0.6 * 1500
    assert chosen[-300:].count(8) > 0.75 * 300  # pulls of the best arm grow over time
    assert stats["8"]["mean_reward"] == pytest.approx(0.7, abs=0.05)
    assert sum(s["pulls"] for s in stats.values()) == 1500


def test_lower_exploration_converges_faster() -> None:
    means = {2: 0.2, 4: 0.35, 8: 0.7, 16: 0.4}
    explorative = HorizonBandit(list(means), seed=1, exploration=1.0)
    greedy = HorizonBandit(list(means), seed=1, exploration=0.3)
    _play(explorative, means, rounds=300, seed=7)
    _play(greedy, means, rounds=300, seed=7)
    assert greedy.stats()["8"]["pulls"] > explorative.stats()["8"]["pulls"]


def test_respects_max_horizon() -> None:
    means = {2: 0.2, 4: 0.35, 8: 0.7, 16: 0.4}
    bandit = HorizonBandit(list(means), seed=0)
    _play(bandit, means, rounds=200, seed=0)
    assert bandit.select() == 8
    for _ in range(50):
        assert bandit.select(max_horizon=5) in (2, 4)
    assert bandit.select(max_horizon=8) == 8
    assert bandit.select(max_horizon=1) == 2  # nothing qualifies: the smallest arm
    fresh = HorizonBandit([2, 4, 8])
    assert fresh.select(max_horizon=0) == 2


def test_max_horizon_plays_unplayed_eligible_arms_only() -> None:
    bandit = HorizonBandit([2, 4, 8, 16])
    seen = set()
    for _ in range(6):
        arm = bandit.select(max_horizon=4)
        seen.add(arm)
        bandit.update(arm, 0.5)
    assert seen == {2, 4}


def _tie_sequence(seed: int, rounds: int = 40) -> list[int]:
    """Constant rewards keep every score tied, so each choice comes from the generator."""
    bandit = HorizonBandit([2, 4, 8, 16], seed=seed)
    seq = []
    for _ in range(rounds):
        arm = bandit.select()
        seq.append(arm)
        bandit.update(arm, 0.5)
    return seq


def test_deterministic_given_seed() -> None:
    assert _tie_sequence(3) == _tie_sequence(3)
    assert _tie_sequence(3) != _tie_sequence(4)


def test_state_dict_round_trip_continues_identically() -> None:
    means = {2: 0.3, 4: 0.5, 8: 0.6, 16: 0.55}
    original = HorizonBandit(list(means), seed=5)
    _play(original, means, rounds=60, seed=11)
    tree, tensors = split_state(original.state_dict())  # as a checkpoint stores it
    assert set(tensors) == {"generator_state"}  # the generator in the tensor file, not as JSON numbers
    state = join_state(json.loads(json.dumps(tree)), {k: v.clone() for k, v in tensors.items()})
    restored = HorizonBandit(list(means), seed=999)
    restored.load_state_dict(state)
    assert restored.stats() == original.stats()
    assert _play(restored, means, rounds=200, seed=12) == _play(original, means, rounds=200, seed=12)
    assert torch.equal(restored.state_dict()["generator_state"], original.state_dict()["generator_state"])


def test_a_state_saved_with_the_generator_as_json_numbers_still_loads() -> None:
    """Checkpoints written before the generator moved to the tensor file."""
    means = {2: 0.3, 4: 0.5}
    original = HorizonBandit(list(means), seed=5)
    _play(original, means, rounds=20, seed=1)
    state = original.state_dict()
    state["generator_state"] = state["generator_state"].tolist()
    restored = HorizonBandit(list(means), seed=999)
    restored.load_state_dict(state)
    assert _play(restored, means, rounds=50, seed=2) == _play(original, means, rounds=50, seed=2)


def test_state_dict_round_trip_keeps_tie_breaking() -> None:
    original = HorizonBandit([2, 4, 8], seed=2)
    for _ in range(10):
        original.update(original.select(), 0.5)
    restored = HorizonBandit([2, 4, 8], seed=77)
    restored.load_state_dict(original.state_dict())
    for _ in range(30):
        a, b = original.select(), restored.select()
        assert a == b
        original.update(a, 0.5)
        restored.update(b, 0.5)


def test_load_state_dict_refuses_other_arms() -> None:
    state = HorizonBandit([2, 4, 8]).state_dict()
    with pytest.raises(ValueError, match=r"\[2, 4, 8\].*\[2, 4, 8, 16\]"):
        HorizonBandit([2, 4, 8, 16]).load_state_dict(state)


def test_global_rng_untouched() -> None:
    torch.manual_seed(1234)
    before = torch.get_rng_state().clone()
    bandit = HorizonBandit([2, 4, 8, 16], seed=3)
    for _ in range(30):
        bandit.update(bandit.select(), 0.5)  # ties: the generator is used every round
    bandit.load_state_dict(bandit.state_dict())
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"arms": []}, "arms"),
        ({"arms": [2, 2, 4]}, "arms"),
        ({"arms": [0, 2]}, "arms"),
        ({"arms": [2.5]}, "arms"),
        ({"arms": [2, 4], "seed": -1}, "seed"),
        ({"arms": [2, 4], "exploration": -0.1}, "exploration"),
        ({"arms": [2, 4], "exploration": math.nan}, "exploration"),
    ],
)
def test_constructor_validation(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        HorizonBandit(**kwargs)


@pytest.mark.parametrize(
    ("arm", "reward", "name"),
    [
        (3, 0.5, "arm"),
        (2, 1.5, "reward"),
        (2, -0.1, "reward"),
        (2, math.nan, "reward"),
        (2, math.inf, "reward"),
    ],
)
def test_update_validation(arm: int, reward: float, name: str) -> None:
    bandit = HorizonBandit([2, 4])
    with pytest.raises(ValueError, match=name):
        bandit.update(arm, reward)
    assert bandit.stats()["2"]["pulls"] == 0.0
