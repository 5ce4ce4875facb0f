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


NOT_A_METHOD = 3
