"""Choosing the predict horizon (how many optimizer steps to predict in a row) with a UCB1 bandit.

Longer horizons save more but are riskier, and the best length depends on the model, the data and the
phase of training, so it is learnt online from each finished predict phase's reward.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from .validation import check_float, check_int

logger = logging.getLogger(__name__)

__all__ = ["HorizonBandit", "default_arms", "phase_reward"]

# Scores closer than this count as tied, so float noise cannot decide between equally good arms.
_TIE_REL_TOL = 1e-12


def default_arms(min_steps: int, max_steps: int) -> list[int]:
    """Candidate horizons: ``min_steps``, the powers of two strictly between, ``max_steps``."""
    check_int("min_steps", min_steps, 1)
    check_int("max_steps", max_steps, min_steps, bounds=f"an integer >= `min_steps` ({min_steps})")
    arms = {min_steps, max_steps}
    power = 1
    while power < max_steps:
        if power > min_steps:
            arms.add(power)
        power *= 2
    return sorted(arms)


def phase_reward(predicted_steps: int, full_steps: int, rolled_back: bool, skill: float) -> float:
    """``predicted_steps / (predicted_steps + full_steps + 1) * clamp(skill, 0, 1)``: the share of backward
    passes its cycle saved, discounted by bad predictions; a rolled-back phase or a NaN skill earns 0."""
    check_int("predicted_steps", predicted_steps, 0)
    check_int("full_steps", full_steps, 0)
    skill = float(skill)
    if rolled_back or predicted_steps == 0 or math.isnan(skill):
        return 0.0
    saved = predicted_steps / (predicted_steps + full_steps + 1)
    return saved * min(max(skill, 0.0), 1.0)


class HorizonBandit:
    """UCB1 over a fixed set of horizons. ``exploration`` scales the bonus ``sqrt(2 ln N / n_arm)`` (real
    rewards span a narrow range: below 1 converges faster); ties break with a private generator."""

    def __init__(self, arms: Sequence[int], seed: int = 0, exploration: float = 1.0) -> None:
        arms = list(arms)
        if not arms:
            raise ValueError("arms must contain at least one horizon, got an empty sequence")
        for arm in arms:
            check_int("arms", arm, 1, bounds=f"integers >= 1 (not {arm!r} in {arms!r})")
        if len(set(arms)) != len(arms):
            raise ValueError(f"arms must be unique, got {arms!r}")
        check_int("seed", seed, 0, 2**63 - 1)
        check_float("exploration", exploration, 0.0, math.inf, high_open=True)
        self.arms: list[int] = sorted(arms)
        self.exploration = float(exploration)
        self._pulls: dict[int, int] = {arm: 0 for arm in self.arms}
        self._reward_sums: dict[int, float] = {arm: 0.0 for arm in self.arms}
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(seed)

    def select(self, max_horizon: int | None = None) -> int:
        """Horizon for the next predict phase among arms <= ``max_horizon`` (else the smallest); unplayed
        arms first, shortest first (short horizons are the safe ones to learn from)."""
        eligible = self.arms if max_horizon is None else [arm for arm in self.arms if arm <= max_horizon]
        if not eligible:
            return self.arms[0]
        for arm in eligible:
            if self._pulls[arm] == 0:
                return arm
        log_total = math.log(sum(self._pulls.values()))
        scores = [
            self._reward_sums[arm] / self._pulls[arm]
            + self.exploration * math.sqrt(2.0 * log_total / self._pulls[arm])
            for arm in eligible
        ]
        best = max(scores)
        tied = [
            arm
            for arm, score in zip(eligible, scores, strict=True)
            if math.isclose(score, best, rel_tol=_TIE_REL_TOL, abs_tol=_TIE_REL_TOL)
        ]
        if len(tied) == 1:
            return tied[0]
        index = int(torch.randint(len(tied), (1,), generator=self._generator).item())
        return tied[index]

    def update(self, arm: int, reward: float) -> None:
        """Record the reward of a finished phase played with horizon ``arm``."""
        if arm not in self._pulls:
            raise ValueError(f"arm must be one of {self.arms}, got {arm!r}")
        check_float("reward", reward, 0.0, 1.0)
        self._pulls[arm] += 1
        self._reward_sums[arm] += float(reward)
        logger.debug("horizon bandit: arm %d reward %.4f (pulls %d)", arm, reward, self._pulls[arm])

    def stats(self) -> dict[str, dict[str, float]]:
        """Per arm (keyed by ``str(arm)``): ``pulls`` and ``mean_reward`` (0 while unplayed), for logging."""
        return {
            str(arm): {
                "pulls": float(self._pulls[arm]),
                "mean_reward": self._reward_sums[arm] / self._pulls[arm] if self._pulls[arm] else 0.0,
            }
            for arm in self.arms
        }

    def state_dict(self) -> dict[str, Any]:
        """State, generator included (a tensor: the checkpoint keeps it with the tensors, not as 19 KB of
        JSON), so a resumed run makes the same choices."""
        return {
            "arms": list(self.arms),
            "pulls": [self._pulls[arm] for arm in self.arms],
            "reward_sums": [self._reward_sums[arm] for arm in self.arms],
            "generator_state": self._generator.get_state().clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; refuses a state saved for different arms."""
        saved_arms = [int(arm) for arm in state["arms"]]
        if saved_arms != self.arms:
            raise ValueError(f"state arms {saved_arms} differ from this bandit's arms {self.arms}")
        pulls = [int(p) for p in state["pulls"]]
        sums = [float(s) for s in state["reward_sums"]]
        if len(pulls) != len(self.arms) or len(sums) != len(self.arms):
            raise ValueError(
                f"state has {len(pulls)} pulls and {len(sums)} reward sums, expected {len(self.arms)} of each"
            )
        self._generator.set_state(torch.as_tensor(state["generator_state"], dtype=torch.uint8).clone())
        self._pulls = dict(zip(self.arms, pulls, strict=True))
        self._reward_sums = dict(zip(self.arms, sums, strict=True))
