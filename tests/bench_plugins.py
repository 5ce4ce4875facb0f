"""A user's own methods, as `hf-hybrid bench --methods bench_plugins:Name` would import them."""

from __future__ import annotations

from transformers import Trainer, TrainerCallback


class CountingTrainer(Trainer):
    """A Trainer subclass that does nothing new but count its training steps (the arena must build it)."""

    built = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        CountingTrainer.built += 1
        self.steps_seen = 0

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.steps_seen += 1
        return super().training_step(model, inputs, num_items_in_batch)


class CountingCallback(TrainerCallback):
    """A callback class: the arena instantiates it and adds it to a plain Trainer."""

    steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        CountingCallback.steps += 1


class FailsLate(TrainerCallback):
    """A method whose every run raises at its fifth step (its first few steps, which the arena times to
    price them, go well): the arena records each failure and goes on."""

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step >= 4:
            raise RuntimeError("this method fails at step 4")


class FailsAtOnce(TrainerCallback):
    """A method that raises at its first step, even while the arena times it."""

    def on_step_begin(self, args, state, control, **kwargs):
        raise RuntimeError("this method fails at once")


class DiesOnce(TrainerCallback):
    """Kills its worker process at its second step, once: the file `$HF_HYBRID_TEST_DIES_ONCE` says it did.
    In the coordinator (where the arena times the method's steps) it trains like plain: a worker's death
    is what the test is about, not the test runner's."""

    def on_step_begin(self, args, state, control, **kwargs):
        import multiprocessing
        import os
        import signal

        marker = os.environ["HF_HYBRID_TEST_DIES_ONCE"]
        in_worker = multiprocessing.parent_process() is not None
        if in_worker and state.global_step == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


NOT_A_METHOD = 3
