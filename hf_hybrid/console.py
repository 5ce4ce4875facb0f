"""What the hybrid trainer adds to HF's console: a compact `hybrid` log entry, the phase on the tqdm bar,
the spike guard's line and the summary. HF's console callbacks are subclassed, so `disable_tqdm` and the
log format behave as users know them; only the console folds the `hybrid/*` keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tqdm.auto import tqdm
from transformers import Trainer
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from .engine.phases import Phase
from .telemetry import console_line, progress_postfix, run_summary


def install_console(trainer: Trainer) -> None:
    """HF's console callbacks made hybrid (the summary after the last step among them)."""
    for default, ours in (
        (ProgressCallback, HybridProgressCallback),
        (PrinterCallback, HybridPrinterCallback),
    ):
        if trainer.pop_callback(default) is not None:
            trainer.add_callback(ours(trainer))


def console_logs(trainer: Any, logs: Mapping[str, Any]) -> dict[str, Any]:
    """The logs as the console shows them: `hybrid/*` keys folded into one `hybrid` entry (unless "full")."""
    if trainer.engine is None:
        return dict(logs)
    if trainer.args.hybrid_console_metrics == "full":
        return {k: phase_name(v) if k == "hybrid/phase" else v for k, v in logs.items()}
    shown = {key: value for key, value in logs.items() if not key.startswith("hybrid/")}
    if len(shown) < len(logs) and "train_runtime" not in logs:
        stats = trainer.engine.stats()
        shown["hybrid"] = console_line(stats["phase"], stats)
    return shown


def phase_name(code: float) -> str:
    """`hybrid/phase` as the console shows it: the name of the phase whose `Phase.index` it is."""
    return list(Phase)[int(code)].value


def guard_line(trainer: Any) -> str | None:
    """What the spike guard holds, for the start of training (None: no guard, or not rank 0)."""
    if trainer.engine is None or trainer.guard_plan is None or not trainer.is_world_process_zero():
        return None
    return trainer.guard_plan.line()


class HybridProgressCallback(ProgressCallback):
    """HF's tqdm callback, with the phase and skipped share on the bar, folded logs and the summary."""

    def __init__(self, trainer: Any) -> None:
        super().__init__()
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_train_begin(args, state, control, **kwargs)
        line = guard_line(self.trainer)
        if line is not None:
            tqdm.write(line)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_step_end(args, state, control, **kwargs)
        engine = self.trainer.engine
        if engine is not None and self.training_bar is not None:
            with engine.timer.part("trainer"):
                stats = engine.stats()
                self.training_bar.set_postfix(progress_postfix(stats["phase"], stats), refresh=False)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        super().on_log(args, state, control, logs=console_logs(self.trainer, logs or {}), **kwargs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_train_end(args, state, control, **kwargs)
        if state.is_world_process_zero and self.trainer.engine is not None:
            tqdm.write(run_summary(self.trainer.hybrid_stats()))


class HybridPrinterCallback(PrinterCallback):
    """HF's plain console callback (`disable_tqdm=True`), with the same compact entry and summary."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        line = guard_line(self.trainer)
        if line is not None:
            print(line)  # the console, as PrinterCallback prints logs

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        super().on_log(args, state, control, logs=console_logs(self.trainer, logs or {}), **kwargs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and self.trainer.engine is not None:
            print(run_summary(self.trainer.hybrid_stats()))  # the console, as PrinterCallback prints logs
