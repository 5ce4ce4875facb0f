"""HybridHFTrainer: the library's one module that knows `transformers.Trainer` internals (its private
hooks, its W&B callback's private state). It does not copy the training loop but hooks in where the loop
calls out (transformers 5.19 to 5.24); each hook's part of a step is told in docs/how-it-works.md.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from peft import PeftModel, get_peft_model
from torch import nn
from torch.distributed.fsdp import FSDPModule
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.integrations import WandbCallback

from .args import HybridArgumentsMixin, upcast_training_args
from .checkpoint import EngineCheckpoints, last_complete_checkpoint
from .clean_batches import Batch, RecentCleanBatches
from .console import guard_line, install_console
from .engine.config import EngineConfig
from .engine.engine import HybridEngine, StepOutcome, StepPlan
from .engine.guard_copies import NoCopy
from .engine.optimizer import HybridOptimizer
from .engine.predictor import DeltaPredictor
from .engine.spike_guard import SpikeGuard
from .guard_storage import StoragePlan, choose_storage, memory_budget, optimizer_state_bytes
from .hybrid_arguments import hybrid_name
from .launch_check import warn_if_launched_alone
from .model_card import card_context, write_hybrid_section
from .parameters import trainable_parameters
from .telemetry import (
    TIMELINE_PLOT_FILE,
    disabled_stats,
    log_image_to_wandb,
    no_predict_reason,
    plot_timeline,
    run_summary,
)

logger = logging.getLogger(__name__)


def _charged(hook: Callable[..., Any]) -> Callable[..., Any]:
    """A trainer-side hook's time is the hybrid trainer's cost: part `trainer` of the engine's clock."""

    @functools.wraps(hook)
    def charged(self: HybridHFTrainer, *args: Any, **kwargs: Any) -> Any:
        with self.engine.timer.part("trainer"):
            return hook(self, *args, **kwargs)

    return charged


class _PredictedSteps(Trainer):
    """What a step without a backward needs of `Trainer`: a forward-only step, a blind one (nothing run),
    and the gradient hooks such a step skips; `optimizer` is then the `HybridOptimizer`."""

    engine: HybridEngine | None

    def _forward_only_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None
    ) -> torch.Tensor:
        """`Trainer.training_step` without the backward, under no_grad: the same set-up, train modes and
        loss scaling, so the logged loss is comparable across phases."""
        cp_context, inputs = self._prepare_context_parallel_inputs(model, inputs)
        with cp_context():
            model.train()
            self.optimizer.train()
            with self.engine.timer.outside():  # the forward itself is the step's compute, not overhead
                inputs = self._prepare_inputs(inputs)
                with torch.no_grad(), self.compute_loss_context_manager():
                    loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        return self._scaled_step_loss(model, loss, num_items_in_batch)

    def _scaled_step_loss(self, model: nn.Module, loss: torch.Tensor, num_items: Any) -> torch.Tensor:
        """A forward-only loss scaled as `training_step` scales it, after resharding under FSDP2."""
        self._reshard_after_forward_only(model)
        if self.args.n_gpu > 1:
            loss = loss.mean()
        if not self._loss_is_scaled_for_ga(num_items):
            loss = loss / self.current_gradient_accumulation_steps
        return loss.detach()

    def _reshard_after_forward_only(self, model: nn.Module) -> None:
        """Under FSDP2, free the parameters a forward without backward left unsharded: FSDP2 reshards the
        root only after the backward, and the next forward would reuse that stale copy, blind to a predicted
        update written into the shards (measured: a 1% loss drift from the single-process run)."""
        if not self.is_fsdp_enabled:
            return
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def _loss_is_scaled_for_ga(self, num_items_in_batch: torch.Tensor | int | None) -> bool:
        if self.loss_is_scaled_for_ga is not None:
            return bool(self.loss_is_scaled_for_ga)
        return (
            self.model_accepts_loss_kwargs and num_items_in_batch is not None
        ) or self.compute_loss_func is not None

    def _blind_step_loss(self, plan: StepPlan) -> torch.Tensor:
        """A blind predicted step measures nothing: the logged loss carries the last measured value."""
        value = plan.carried_loss if plan.carried_loss is not None else float("nan")
        return torch.tensor(value / self.current_gradient_accumulation_steps, device=self.args.device)

    def _clip_grad_norm(self, model: nn.Module) -> Any:
        if self._in_predicted_step():
            return None  # no gradients exist; clipping would also break a fp16 GradScaler
        return super()._clip_grad_norm(model)

    def _get_grad_norm(self, model: nn.Module, grad_norm: Any = None) -> Any:
        if self._in_predicted_step():
            return None
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        if self.engine is not None:
            with self.engine.timer.part("trainer"):  # a host read: a device sync on an accelerator
                self.optimizer.set_grad_norm(None if grad_norm is None else float(grad_norm))
        return grad_norm

    def _in_predicted_step(self) -> bool:
        plan = self.optimizer.plan if isinstance(self.optimizer, HybridOptimizer) else None
        return plan is not None and not plan.phase.runs_backward


class HybridHFTrainer(_PredictedSteps):
    """`transformers.Trainer` whose optimizer steps go through the hybrid phase machine.

    Takes everything `Trainer` takes, plus `peft_config` (wraps the model with peft, as TRL does),
    `predictor` (a `DeltaPredictor` instance, instead of the one `hybrid_predictor` names) and
    `engine_config` (replaces the one built from the `hybrid_*` arguments). A plain `TrainingArguments`
    is upcast with the hybrid defaults; `hybrid_enabled=False` is the plain Trainer.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        args: TrainingArguments | None = None,
        *more: Any,
        peft_config: Any = None,
        engine_config: EngineConfig | None = None,
        predictor: DeltaPredictor | None = None,
        **kwargs: Any,
    ) -> None:
        args = upcast_training_args(args)
        if predictor is not None and not isinstance(predictor, DeltaPredictor):
            raise TypeError(
                f"`predictor` must be a hf_hybrid.DeltaPredictor instance, got {type(predictor).__qualname__}"
            )
        self._engine_config = engine_config
        self._predictor = predictor
        if peft_config is not None:
            model = _wrap_with_peft(model, peft_config)
        super().__init__(model, args, *more, **kwargs)
        warn_if_launched_alone(self.args.world_size)
        self.engine: HybridEngine | None = None
        self.hybrid_timeline: list[dict[str, Any]] = []
        self.guard_plan: StoragePlan | None = None  # where the spike guard's copies live, and why
        self._step_batches: list[tuple[nn.Module, dict[str, Any], Any]] = []  # this step's micro-batches
        self._step_rng: tuple[torch.Tensor, torch.Tensor | None] | None = None  # the RNG as the step began
        self.clean_batches: RecentCleanBatches | None = None  # what the guard trains on instead of a skip
        self.checkpoints = EngineCheckpoints(args.hybrid_restart_engine, rename=hybrid_name)
        if self.hybrid_args.hybrid_enabled:
            self.add_callback(HybridStepCallback(self))
            install_console(self)
            self.add_callback(self.checkpoints.callback)

    @property
    def engine_config(self) -> EngineConfig:
        return self._engine_config or self.hybrid_args.engine_config()

    @property
    def hybrid_args(self) -> HybridArgumentsMixin:
        return self.args  # type: ignore[return-value]

    # ---- set-up around the (unchanged) loop -----------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """`resume_from_checkpoint=True` takes the newest complete checkpoint; a hybrid state that cannot
        fit is refused before any weight is loaded."""
        if self.hybrid_args.hybrid_enabled:
            if resume_from_checkpoint is True:
                restart = self.hybrid_args.hybrid_restart_engine
                resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir, not restart) or True
            if isinstance(resume_from_checkpoint, str):
                params = trainable_parameters(self.model)
                self.checkpoints.check(
                    resume_from_checkpoint, self.engine_config, params, self._shard_world_size()
                )
            _check_not_empty(self.train_dataset)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _shard_world_size(self) -> int:
        """Over how many ranks `prepare` will shard the engine's parameters (FSDP2: all; else 1)."""
        if self.is_fsdp_enabled and unsupported_distribution(self) is None:
            return self.accelerator.num_processes
        return 1

    def _prepare_for_training(
        self, max_steps: int, train_dataloader: Any, resume_from_checkpoint: Any
    ) -> Any:
        if isinstance(self.optimizer, HybridOptimizer):  # a second train() call: prepare the real one
            self.optimizer = self.optimizer.optimizer
        model, train_dataloader = super()._prepare_for_training(
            max_steps, train_dataloader, resume_from_checkpoint
        )
        if self.hybrid_args.hybrid_enabled:
            self._start_engine(model, resume_from_checkpoint)
            self._warn_if_all_warmup(max_steps)
        return model, train_dataloader

    def _warn_if_all_warmup(self, max_steps: int) -> None:
        """A run that ends inside the warmup never predicts: say so once, instead of a silent plain run."""
        left = None if self.engine is None else self.engine.stats()["warmup_steps_left"]
        if left is not None and max_steps - self.state.global_step <= left:
            logger.warning(
                "hf_hybrid: max_steps=%d ends inside the hybrid warmup (hybrid_warmup_steps=%d), so no "
                "predict phase can open and this run trains exactly like the plain Trainer; lower "
                "`hybrid_warmup_steps` or raise `max_steps` to use the hybrid phases",
                max_steps,
                self.engine_config.schedule.warmup_steps,
            )

    def _start_engine(self, model: nn.Module, checkpoint: str | None = None) -> None:
        unsupported = unsupported_distribution(self)
        if unsupported:
            logger.warning(
                "hf_hybrid: %s; predict phases are off and this run trains exactly like the plain Trainer.",
                unsupported,
            )
            self.engine = None
            return
        _check_launch(self.accelerator.num_processes)
        params = trainable_parameters(self.accelerator.unwrap_model(model, keep_torch_compile=False))
        if not params:
            raise ValueError(
                "HybridHFTrainer: the model has no trainable parameter (all have requires_grad=False); "
                "unfreeze some parameters or pass a peft_config"
            )
        probe = _loss_probe(self) if self.hybrid_args.hybrid_probe_batches else None
        config = self.engine_config
        guard = self._build_spike_guard(params)
        self.engine = HybridEngine(params, config, self.optimizer, probe, self._predictor, guard)
        self.hybrid_timeline = (
            []
            if checkpoint is None
            else self.checkpoints.restore(self.engine, checkpoint, config.schedule.warmup_steps)
        )
        if checkpoint is not None and self.clean_batches is not None:
            self.clean_batches.load(checkpoint, self.args.process_index, self.accelerator.device)
        self.optimizer = HybridOptimizer(
            self.optimizer,
            self.engine,
            skip_nonfinite_step=self.accelerator.scaler is None,
            mean_over_ranks=self._mean_over_ranks,
            learning_rate=self._get_learning_rate,
            on_outcome=self._record_outcome,
        )
        self.callback_handler.optimizer = self.optimizer

    def _build_spike_guard(self, params: dict[str, torch.Tensor]) -> SpikeGuard | None:
        """The spike guard `hybrid_spike_guard` asks for, its copies where they fit (`guard_storage`)."""
        args = self.hybrid_args
        self.guard_plan, self.clean_batches = None, None
        if args.hybrid_spike_guard == "off":
            return None
        tensors = list(params.values())
        weights = sum(p.numel() * p.element_size() for p in tensors)
        plan = choose_storage(
            args.hybrid_guard_storage,
            weights,
            optimizer_state_bytes(self.optimizer, tensors),
            memory_budget(args.hybrid_guard_memory_mb),
            saves_checkpoints=self.args.save_strategy != "no" and not self.args.save_only_model,
            update_check=args.hybrid_guard_max_update_ratio > 0,
            every=args.hybrid_guard_every,
            spacing_mb=args.hybrid_guard_spacing_mb,
        )
        if plan.storage == "none" and args.hybrid_spike_guard == "auto":
            logger.warning("hf_hybrid: spike guard off (hybrid_spike_guard=auto): %s", plan.reason)
            return None
        self.guard_plan = plan
        config = dataclasses.replace(
            args.spike_guard_config(plan.storage),
            every=plan.copy_every or args.hybrid_guard_every,
            max_update_ratio=args.hybrid_guard_max_update_ratio if plan.update_check else 0.0,
        )
        copies = (_CheckpointCopy(self), _CheckpointCopy(self)) if plan.storage == "checkpoint" else None
        self.clean_batches = RecentCleanBatches(self._step_inputs, self._train_step_on)
        return SpikeGuard(
            self.optimizer,
            config,
            suspect_loss=self._suspect_loss,
            copies=copies,
            clean_batches=self.clean_batches,
        )

    def _suspect_loss(self) -> float | None:
        """This step's loss at the live weights, measured again as training measured it without a gradient,
        the random state put back after (dropout draws no number the run would have drawn)."""
        if not self._step_batches:
            return None
        cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=cuda), torch.no_grad():
            total = torch.stack([self._measure_again(*batch) for batch in self._step_batches]).sum()
        return float(self._mean_over_ranks(total))

    def _step_inputs(self) -> list[Batch]:
        return [(inputs, num_items) for _, inputs, num_items in self._step_batches]

    def _train_step_on(self, batches: list[Batch]) -> None:
        """This step's gradients made again from `batches` as the loop makes them (forward and backward of
        each micro-batch, clipped), the random state first put back to the step's start: the step the
        plain Trainer would have run on those batches (on batches of the same shapes, the same dropout)."""
        model = self._step_batches[0][0]
        model.zero_grad()
        if self._step_rng is not None:
            _set_rng_state(self._step_rng)
        for inputs, num_items in batches:
            super().training_step(model, inputs, num_items)
        if self.args.max_grad_norm is not None and self.args.max_grad_norm > 0:
            self._clip_grad_norm(model)

    def _measure_again(self, model: nn.Module, inputs: dict[str, Any], num_items: Any) -> torch.Tensor:
        model.train()
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, self._prepare_inputs(inputs), num_items_in_batch=num_items)
        return self._scaled_step_loss(model, loss, num_items)

    # ---- one optimizer step ---------------------------------------------------------------------

    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        if self.engine is None:
            return super().training_step(model, inputs, num_items_in_batch)
        timer = self.engine.timer  # all but the plain step's own work is the hybrid trainer's cost
        with timer.part("trainer"):
            plan = self.optimizer.plan  # opened on the step's first micro-batch (`on_step_begin`)
            if plan.phase.runs_backward:
                if self.engine.spike_guard.params and not self._step_batches:
                    self._step_rng = _rng_state()
                with timer.outside():
                    loss = super().training_step(model, inputs, num_items_in_batch)
                if self.engine.spike_guard.params:  # references only: the guard may measure them again
                    self._step_batches.append((model, inputs, num_items_in_batch))
            elif plan.measure_loss:
                loss = self._forward_only_step(model, inputs, num_items_in_batch)
            else:
                return self._blind_step_loss(plan)
            self.optimizer.add_loss(loss)
            return loss

    def _mean_over_ranks(self, total: torch.Tensor) -> torch.Tensor:
        """The step's loss averaged over ranks, so every rank feeds the engine the same value."""
        if self.accelerator.num_processes > 1:
            return self.accelerator.reduce(total, reduction="mean")
        return total

    @_charged
    def _record_outcome(self, outcome: StepOutcome, seconds: float) -> None:
        """One timeline row per optimizer step (the plot, the model card and resume read it)."""
        self._step_batches = []
        self.hybrid_timeline.append(
            {
                "step": self.state.global_step + 1,
                "phase": outcome.phase.value,
                "loss": outcome.loss,
                "predicted_loss": outcome.predicted_loss,
                "rolled_back": outcome.rolled_back,
                "level": int(outcome.level),
                "action": outcome.action.value,
                "seconds": seconds,
            }
        )

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """Runs on every rank, before trainer_state.json is written, hub-pushed and rotated."""
        super()._save_optimizer_and_scheduler(output_dir)
        if self.engine is not None:
            if self.checkpoints.callback not in self.callback_handler.callbacks:
                # HF re-creates stateful callbacks with `restore_callback_states_from_checkpoint`
                self.callback_handler.pop_callback(type(self.checkpoints.callback))
                self.add_callback(self.checkpoints.callback)
            self.checkpoints.save(self.engine, self.hybrid_timeline, output_dir, self.args.should_save)
            if self.clean_batches is not None:
                self.clean_batches.save(output_dir, self.args.process_index)

    # ---- what users see -------------------------------------------------------------------------

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Training logs get the `hybrid/*` metrics, so every reporter and `trainer_state.json` see them.
        No per-rank reduction is needed: every metric comes from quantities identical on every rank."""
        if self.engine is not None and "loss" in logs:
            with self.engine.timer.part("trainer"):
                logs.update({f"hybrid/{key}": value for key, value in self.engine.metrics().items()})
        if self.engine is not None and "train_runtime" in logs:  # the end-of-run metrics
            stats = self.hybrid_stats()
            logs.update({f"hybrid/{key}": float(stats[key]) for key in _SUMMARY_KEYS})
            logs["hybrid/engine_time_share"] = stats["timing"]["engine_time_share"]
        super().log(logs, start_time)

    def hybrid_stats(self) -> dict[str, Any]:
        """Plain dict of the engine's counters, bytes and confidence, and under `timing` the share of the
        step time the hybrid machinery took (the only entry that varies run to run)."""
        if self.engine is None:  # the same keys as a run that predicted nothing, zeros where nothing happened
            return disabled_stats(self.engine_config)
        stats = {"enabled": True, **self.engine.stats(), "timing": self.engine.timing()}
        stats["no_predict_reason"] = no_predict_reason(stats)
        return stats

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """HF's card (also the one `push_to_hub` writes), plus the "Hybrid training" section and the
        `hf-hybrid` tag, added after peft has updated an adapter's card (peft rewrites the tags)."""
        super().create_model_card(*args, **kwargs)
        if self.engine is None or not self.is_world_process_zero():
            return
        engine, settings = self.engine, self.hybrid_args.hybrid_dict()
        write_hybrid_section(
            os.path.join(self.args.output_dir, "README.md"),
            card_context(engine.stats(), engine.metrics(), settings, self.hybrid_timeline),
            finetuned_from=kwargs.get("finetuned_from"),
            model=self.accelerator.unwrap_model(self.model),
        )


class HybridStepCallback(TrainerCallback):
    """Opens each optimizer step on its first micro-batch; after the last, the timeline plot and summary.
    Added after the reporters, so a W&B run is still open for the plot."""

    def __init__(self, trainer: HybridHFTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        line = guard_line(self.trainer)
        if line is not None:
            logger.info(line)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer.engine is not None:
            with self.trainer.engine.timer.part("trainer"):
                self.trainer.optimizer.begin_step(state.global_step + 1)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = self.trainer
        if trainer.engine is None or not state.is_world_process_zero:
            return
        publish_timeline_plot(trainer)
        logger.info(run_summary(trainer.hybrid_stats()))


def publish_timeline_plot(trainer: HybridHFTrainer) -> None:
    """`output_dir/hybrid_timeline.png`, and the same image on the W&B run."""
    if not trainer.hybrid_timeline:
        return
    try:
        path = plot_timeline(
            trainer.hybrid_timeline, os.path.join(trainer.args.output_dir, TIMELINE_PLOT_FILE)
        )
    except (ImportError, OSError) as exc:  # the trained model matters more than its plot
        logger.warning("hf_hybrid: could not write the phase-timeline plot: %r", exc)
        return
    for callback in trainer.callback_handler.callbacks:
        wandb = getattr(callback, "_wandb", None) if isinstance(callback, WandbCallback) else None
        if wandb is not None and getattr(callback, "_initialized", False) and wandb.run is not None:
            log_image_to_wandb(wandb, path, trainer.state.global_step)


def unsupported_distribution(trainer: Trainer) -> str | None:
    """Why predict phases cannot run under the trainer's accelerate set-up (None: they can; FSDP2's
    dim-0 `DTensor` shards are handled by `engine/sharding.py`)."""
    if trainer.is_deepspeed_enabled:
        return _DEEPSPEED_UNSUPPORTED
    if not trainer.is_fsdp_enabled:
        return None
    fsdp_version = getattr(trainer.accelerator.state.fsdp_plugin, "fsdp_version", 1)
    return _FSDP1_UNSUPPORTED if fsdp_version != 2 else None


_DEEPSPEED_UNSUPPORTED = (
    "DeepSpeed (every ZeRO stage) keeps the fp32 master weights inside its optimizer, so a predicted update "
    "written into the model would be overwritten (ZeRO-1/2) or land in an empty placeholder (ZeRO-3); use "
    "FSDP2 (fsdp_version: 2) or DDP for predict phases"
)
_FSDP1_UNSUPPORTED = (
    "FSDP1 (fsdp_version: 1) flattens the parameters into one FlatParameter shard per rank, which the engine "
    "cannot split into whole tensors; set fsdp_version: 2 in the accelerate config (or "
    "fsdp_config={'fsdp_version': 2}) for predict phases under FSDP"
)
_SUMMARY_KEYS = (
    "backward_skipped_fraction",
    "rollbacks",
    "predict_phases",
    "max_confidence",
    "engine_peak_bytes",
)


def _loss_probe(trainer: HybridHFTrainer) -> Callable[[], float]:
    """Mean loss of fixed training examples (eval mode, no_grad), averaged over ranks. They come from the
    *training* set (the eval set must never steer training): the probe only ranks two nearby weights."""
    count = trainer.hybrid_args.hybrid_probe_batches * trainer.args.per_device_train_batch_size
    subset = _probe_examples(trainer.train_dataset, count, trainer.engine_config.seed)
    batches = list(trainer.get_eval_dataloader(subset))

    def probe() -> float:
        model = trainer.model
        was_training = model.training
        model.eval()
        with torch.no_grad():
            total = sum(
                trainer.compute_loss(model, trainer._prepare_inputs(batch)).detach() for batch in batches
            )
        model.train(was_training)
        trainer._reshard_after_forward_only(model)
        loss = total / len(batches)
        if trainer.accelerator.num_processes > 1:
            loss = trainer.accelerator.reduce(loss, reduction="mean")
        return float(loss)

    return probe


def _rng_state() -> tuple[torch.Tensor, torch.Tensor | None]:
    """The generators dropout draws from: the CPU's and the current CUDA device's."""
    return torch.random.get_rng_state(), torch.cuda.get_rng_state() if torch.cuda.is_available() else None


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    cpu, cuda = state
    torch.random.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)


class _CheckpointCopy(NoCopy):
    """`hybrid_guard_storage=checkpoint`: the copy is the checkpoint the Trainer saved at its step, read
    back on a restore (the scheduler keeps following the step count); nothing is held in memory. Not
    periodic: taken only where the Trainer saves (the engine's save rebases the guard)."""

    persistent = True  # on disk: a resumed run finds the trusted checkpoint too

    def __init__(self, trainer: HybridHFTrainer) -> None:
        super().__init__()
        self.trainer = trainer

    def folder(self) -> str:
        return os.path.join(self.trainer.args.output_dir, f"checkpoint-{self.step}")

    def take(self, step: int, params: list[torch.Tensor], optimizer: Any) -> None:
        self.step = step

    def available(self) -> str | None:
        if self.step is None:
            return "no checkpoint saved since the last one was restored or trusted"
        if not os.path.isdir(self.folder()):
            return (
                f"{self.folder()} is gone (deleted, or rotated away by save_total_limit): the spike guard "
                "falls back to skipping bad batches until the next checkpoint"
            )
        return None

    def restore(self, params: list[torch.Tensor], optimizer: Any) -> None:
        """The weights are on disk: a spike is blamed without a second measurement (no `swap`)."""
        trainer = self.trainer
        schedule = trainer.lr_scheduler.state_dict()
        trainer._load_from_checkpoint(self.folder())
        trainer._load_optimizer_and_scheduler(self.folder())
        trainer.lr_scheduler.load_state_dict(schedule)


def _probe_examples(dataset: Any, count: int, seed: int) -> Any:
    """`count` training examples drawn with the engine's seed (the same on every rank)."""
    if not hasattr(dataset, "__len__"):
        raise ValueError(
            "`hybrid_probe_batches` needs a train_dataset with a length (not an IterableDataset)"
        )
    generator = torch.Generator().manual_seed(seed)
    indices = torch.randperm(len(dataset), generator=generator)[: min(len(dataset), count)].tolist()
    return (
        dataset.select(indices) if hasattr(dataset, "select") else torch.utils.data.Subset(dataset, indices)
    )


def _check_launch(num_processes: int) -> None:
    """Refuse processes that were launched together but would each train alone into one output_dir."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and num_processes == 1:
        raise ValueError(
            f"HybridHFTrainer: launched as one of WORLD_SIZE={launched} processes, but this "
            "process trains alone (accelerate found no GPU and `use_cpu` is False), so every process "
            "would run the same training independently into the same output_dir. On a machine "
            "without GPUs set `use_cpu=True` (`--use_cpu`) to train the processes together over "
            "gloo, or launch one process."
        )


def _check_not_empty(dataset: Any) -> None:
    """Name the cause (torch's sampler would only say `num_samples=0`), before any step is spent."""
    if dataset is not None and hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ValueError(
            "HybridHFTrainer: `train_dataset` is empty (0 examples), there is nothing to train on; "
            "pass a dataset with at least one example"
        )


def _wrap_with_peft(model: nn.Module | None, peft_config: Any) -> nn.Module:
    if model is None:
        raise ValueError("`peft_config` needs a `model` to wrap")
    if isinstance(model, PeftModel):
        raise ValueError(
            "the model is already a PeftModel and a `peft_config` was passed too; pass one or the other"
        )
    return get_peft_model(model, peft_config)
