"""What the engine watches (`watch.py`): the real updates and the predictor's guesses, asleep on a sample
of the coordinates, awake on the whole parameters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from engine_loop import Loop, engine_config

from hf_hybrid.engine.divergence import DivergenceLevel
from hf_hybrid.engine.predictor import Deltas, EMAPredictor, register_predictor, unregister_predictor
from hf_hybrid.engine.watch import UpdateWatch


def _params() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {"w": torch.randn(64, 32, generator=generator), "b": torch.randn(32, generator=generator)}


def _watch(params: dict[str, torch.Tensor], predictor: str = "ema", may_sleep: bool = True) -> UpdateWatch:
    return UpdateWatch(params, predictor, {}, None, seed=0, may_sleep=may_sleep)


def test_update_tracker_follows_the_parameters() -> None:
    loop = Loop(engine_config())
    loop.run(60)
    engine = loop.engine
    assert engine.watch.updates.last.keys() == loop.params.keys()
    for name, p in loop.params.items():
        assert torch.equal(engine.watch.updates.last[name], p.detach().float())


def test_asleep_it_holds_the_sample_only_awake_the_whole_parameters() -> None:
    params = _params()
    watch = _watch(params)
    assert not watch.awake and watch.updates is None
    whole = sum(p.numel() for p in params.values())
    assert 0 < sum(t.numel() for t in watch.tensors()) < whole  # the sampled tracker and predictor
    watch.set_awake(True)
    assert watch.awake and watch.predictor is not watch.scorer
    assert sum(t.numel() for t in watch.tensors()) >= 2 * whole  # the last weights and the EMA, whole


def test_one_real_update_reaches_both_predictors_and_their_guesses_agree_on_the_sample() -> None:
    params = _params()
    watch = _watch(params, may_sleep=False)
    for _ in range(3):
        for p in params.values():
            p.add_(0.01)
        watch.observe(*watch.take())
    whole, _ = watch.guess(1)
    sampled, _ = watch.sampled_guess(1)
    assert whole.keys() == params.keys() and all(whole[n].shape == p.shape for n, p in params.items())
    for name, delta in sampled.items():  # the scorer is a twin: it guesses what the full-size one does
        assert torch.allclose(delta, watch.sample.gather(name, whole[name]))


class _WrongShape(EMAPredictor):
    name = "test-wrong-shape"

    def predict(self, steps_ahead: int) -> Deltas | None:
        return {"w": torch.zeros(3)}  # neither the parameter's shape nor the sample's


@pytest.fixture
def wrong_shape() -> Iterator[None]:
    register_predictor(_WrongShape.name, _WrongShape)
    yield
    unregister_predictor(_WrongShape.name)


@pytest.mark.usefixtures("wrong_shape")
def test_a_guess_of_the_wrong_shape_is_refused_critical_to_apply_harmless_to_score() -> None:
    watch = _watch(_params(), predictor=_WrongShape.name, may_sleep=False)
    guess, alarm = watch.guess(1)
    assert guess is None and alarm.level is DivergenceLevel.CRITICAL and alarm.blames_weights
    guess, alarm = watch.sampled_guess(1)
    assert guess is None and alarm.level is DivergenceLevel.WARNING and not alarm.blames_weights


def test_a_written_guess_is_no_part_of_the_next_real_update() -> None:
    params = _params()
    watch = _watch(params, may_sleep=False)
    written = {name: torch.full_like(p, 0.5) for name, p in params.items()}
    for name, p in params.items():
        p.add_(written[name])  # the guess, as the guard writes it
    watch.shift(written)
    for p in params.values():
        p.add_(0.25)  # the optimizer's own step
    _, whole = watch.take()
    assert whole.keys() == params.keys()
    for name, p in params.items():
        assert torch.allclose(whole[name], torch.full_like(p, 0.25))
