"""HybridHFTrainer: the only module that knows `transformers.Trainer` internals.

It does not copy the training loop; it hooks in where the loop already calls out (see the shared notes
on 5.x):

- `_prepare_for_training`: once the model and optimizer are prepared, build the engine and put a
  `HybridOptimizer` in place of `self.optimizer`, so the loop's own `self.optimizer.step()` is where the
  engine applies the real step or the predicted update;
- `training_step`: on the first micro-batch of an optimizer step the engine decides the phase; then a full
  step, a forward-only step, or no forward at all;
- `_clip_grad_norm` / `_get_grad_norm`: skipped in predicted steps (no gradients exist; clipping would
  also break a fp16 GradScaler); in real steps the gradient norm goes into the step's record;
- `_save_optimizer_and_scheduler` / `_load_optimizer_and_scheduler`: the hybrid state in the checkpoint.
The learning-rate schedule keeps advancing in every phase because the loop calls `lr_scheduler.step()`.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import Trainer, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerCallback

from .args import HybridArgumentsMixin, upcast_training_args
from .checkpoint import (
    HybridCheckpointError,
    HybridStateCallback,
    last_complete_checkpoint,
    load_engine_state,
    load_timeline,
    rank_pair,
    read_engine_entry,
    read_engine_tree,
    save_engine_state,
    save_sharded_engine_state,
    save_timeline,
    sharding_problem,
)
from .engine.config import EngineConfig
from .engine.engine import HybridEngine, StepOutcome, StepPlan, StepRecord
from .engine.optimizer import HybridOptimizer
from .engine.phases import Phase
from .engine.predictor import DeltaPredictor
from .engine.state import describe_mismatch
from .hybrid_arguments import hybrid_name
from .model_card import add_hybrid_section, card_context, render_section
from .parameters import trainable_parameters
from .telemetry import (
    TIMELINE_PLOT_FILE,
    console_line,
    log_image_to_wandb,
    no_predict_reason,
    plot_timeline,
    progress_postfix,
    run_summary,
)

logger = logging.getLogger(__name__)


def _charged(hook: Callable[..., Any]) -> Callable[..., Any]:
    """What a trainer-side hook does is the hybrid trainer's cost: it goes on the engine's clock
    (`hybrid_stats()["timing"]`, part `trainer`), beside the engine's own parts."""

    @functools.wraps(hook)
    def charged(self: HybridHFTrainer, *args: Any, **kwargs: Any) -> Any:
        with self.engine.timer.part("trainer"):
            return hook(self, *args, **kwargs)

    return charged


class HybridHFTrainer(Trainer):
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
        self.engine: HybridEngine | None = None
        self.hybrid_timeline: list[dict[str, Any]] = []
        self._window_losses: list[torch.Tensor] = []
        self._grad_norm: float | None = None
        self._resume_checkpoint: str | None = None
        self._step_started = 0.0
        self._state_callback = HybridStateCallback()
        if self.hybrid_args.hybrid_enabled:
            self.add_callback(_HybridStepCallback(self))
            self.add_callback(self._state_callback)
            self._use_hybrid_console()

    def _use_hybrid_console(self) -> None:
        """HF's console callback (tqdm bar, or plain printing with `disable_tqdm`), made to show the
        hybrid metrics compactly and the end-of-run summary."""
        for default, ours in (
            (ProgressCallback, _HybridProgressCallback),
            (PrinterCallback, _HybridPrinterCallback),
        ):
            if self.pop_callback(default) is not None:
                self.add_callback(ours(self))

    @property
    def engine_config(self) -> EngineConfig:
        return self._engine_config or self.hybrid_args.engine_config()

    @property
    def hybrid_args(self) -> HybridArgumentsMixin:
        return self.args  # type: ignore[return-value]

    # ---- set-up around the (unchanged) loop -----------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """`resume_from_checkpoint=True` takes the newest checkpoint whose save finished."""
        if resume_from_checkpoint is True and self.hybrid_args.hybrid_enabled:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir) or True
        if isinstance(resume_from_checkpoint, str) and self.hybrid_args.hybrid_enabled:
            self._check_resumable(resume_from_checkpoint)
        if self.hybrid_args.hybrid_enabled:
            _check_not_empty(self.train_dataset)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _check_resumable(self, checkpoint: str) -> None:
        """Refuse a checkpoint whose hybrid state cannot fit, before its weights are even loaded."""
        entry = read_engine_entry(checkpoint)
        if entry is None or self.hybrid_args.hybrid_restart_engine:
            return
        problem = sharding_problem(entry, self._shard_world_size())
        if not problem:  # configuration and parameter shapes are the same in every rank's file
            state = read_engine_tree(rank_pair(entry, 0), checkpoint)
            params = trainable_parameters(self.model)
            try:
                problem = describe_mismatch(
                    state["config"], state["parameters"], self.engine_config, params, rename=hybrid_name
                )
            except (KeyError, TypeError) as exc:
                problem = f"its hybrid state is damaged ({exc!r})"
        if problem:
            raise HybridCheckpointError(
                f"cannot resume the hybrid engine from {checkpoint}: {problem}. Resume with the same hybrid "
                "configuration and trainable parameters, or set `hybrid_restart_engine=True` to start afresh."
            )

    def _shard_world_size(self) -> int:
        """Over how many ranks the engine's parameters will be sharded (1: whole tensors), known before
        `prepare` shards them: FSDP2 shards over every process."""
        if self.is_fsdp_enabled and self._unsupported_distribution() is None:
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
            self._start_engine(model)
            self._warn_if_all_warmup(max_steps)
        return model, train_dataloader

    def _warn_if_all_warmup(self, max_steps: int) -> None:
        """A run that ends inside the warmup never predicts: say so once, instead of a silent plain run."""
        if self.engine is None or self.engine.config.schedule.script is not None:
            return
        warmup = self.engine.config.schedule.warmup_steps
        if max_steps - self.state.global_step <= warmup - self.engine.controller.steps_decided:
            logger.warning(
                "hf_hybrid: max_steps=%d ends inside the hybrid warmup (hybrid_warmup_steps=%d), so no "
                "predict phase can open and this run trains exactly like the plain Trainer; lower "
                "`hybrid_warmup_steps` or raise `max_steps` to use the hybrid phases",
                max_steps,
                warmup,
            )

    def _start_engine(self, model: nn.Module) -> None:
        unsupported = self._unsupported_distribution()
        if unsupported:
            logger.warning(
                "hf_hybrid: %s; predict phases are off and this run trains exactly like the plain Trainer.",
                unsupported,
            )
            self.engine = None
            return
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched > 1 and self.accelerator.num_processes == 1:
            raise ValueError(
                f"HybridHFTrainer: launched as one of WORLD_SIZE={launched} processes, but this "
                "process trains alone (accelerate found no GPU and `use_cpu` is False), so every process "
                "would run the same training independently into the same output_dir. On a machine "
                "without GPUs set `use_cpu=True` (`--use_cpu`) to train the processes together over "
                "gloo, or launch one process."
            )
        params = trainable_parameters(self.accelerator.unwrap_model(model, keep_torch_compile=False))
        if not params:
            raise ValueError(
                "HybridHFTrainer: the model has no trainable parameter (all have requires_grad=False); "
                "unfreeze some parameters or pass a peft_config"
            )
        probe = self._build_probe() if self.hybrid_args.hybrid_probe_batches else None
        self.engine = HybridEngine(
            params, self.engine_config, optimizer=self.optimizer, probe=probe, predictor=self._predictor
        )
        self.hybrid_timeline = []
        if self._resume_checkpoint is not None:
            self._restore_engine(self._resume_checkpoint)
            self._resume_checkpoint = None
        self.optimizer = HybridOptimizer(
            self.optimizer,
            self.engine,
            record=self._step_record,
            skip_nonfinite_step=self.accelerator.scaler is None,
        )
        self.callback_handler.optimizer = self.optimizer

    def _unsupported_distribution(self) -> str | None:
        """Why predict phases cannot run under this accelerate set-up (None: they can).

        FSDP2 is supported: its parameters are `DTensor`s sharded on dim 0, which the engine handles
        shard by shard (`engine/sharding.py`). FSDP1 flattens each wrapped module's parameters into one
        `FlatParameter` per rank, a plain tensor whose slices the engine cannot tell apart from a whole
        tensor; DeepSpeed keeps the fp32 master weights inside its optimizer.
        """
        if self.is_deepspeed_enabled:
            return (
                "DeepSpeed (every ZeRO stage) keeps the fp32 master weights inside its optimizer, so a "
                "predicted update written into the model would be overwritten (ZeRO-1/2) or land in an "
                "empty placeholder (ZeRO-3); use FSDP2 (fsdp_version: 2) or DDP for predict phases"
            )
        if self.is_fsdp_enabled and getattr(self.accelerator.state.fsdp_plugin, "fsdp_version", 1) != 2:
            return (
                "FSDP1 (fsdp_version: 1) flattens the parameters into one FlatParameter shard per rank, "
                "which the engine cannot split into whole tensors; set fsdp_version: 2 in the accelerate "
                "config (or fsdp_config={'fsdp_version': 2}) for predict phases under FSDP"
            )
        return None

    def _build_probe(self) -> Callable[[], float]:
        """Mean loss of fixed training examples (eval mode, no_grad), averaged over ranks.

        The examples are drawn from the *training* set with the engine's seed: the eval set must never steer
        training. They stay in training too, so the probe is not a clean held-out estimate; it only has to
        rank two nearby weight vectors on the same batches.
        """
        dataset = self.train_dataset
        if not hasattr(dataset, "__len__"):
            raise ValueError(
                "`hybrid_probe_batches` needs a train_dataset with a length (not an IterableDataset)"
            )
        count = min(
            len(dataset), self.hybrid_args.hybrid_probe_batches * self.args.per_device_train_batch_size
        )
        generator = torch.Generator().manual_seed(self.engine_config.seed)
        indices = torch.randperm(len(dataset), generator=generator)[:count].tolist()
        subset = (
            dataset.select(indices)
            if hasattr(dataset, "select")
            else torch.utils.data.Subset(dataset, indices)
        )
        batches = list(self.get_eval_dataloader(subset))

        def probe() -> float:
            model = self.model
            was_training = model.training
            model.eval()
            with torch.no_grad():
                total = sum(
                    self.compute_loss(model, self._prepare_inputs(batch)).detach() for batch in batches
                )
            model.train(was_training)
            self._reshard_after_forward_only(model)
            loss = total / len(batches)
            if self.accelerator.num_processes > 1:
                loss = self.accelerator.reduce(loss, reduction="mean")
            return float(loss)

        return probe

    # ---- one micro-batch ------------------------------------------------------------------------

    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        if self.engine is None:
            return super().training_step(model, inputs, num_items_in_batch)
        timer = self.engine.timer  # all but the plain step's own work is the hybrid trainer's cost
        with timer.part("trainer"):
            plan = self._step_plan()
            if plan.phase.runs_backward:
                with timer.outside():
                    loss = super().training_step(model, inputs, num_items_in_batch)
            elif plan.measure_loss:
                loss = self._forward_only_step(model, inputs, num_items_in_batch)
            else:
                return self._blind_step_loss()
            self._window_losses.append(loss)
            return loss

    def _step_plan(self) -> StepPlan:
        """The phase is decided once per optimizer step, on its first micro-batch, on every rank: the
        engine holds the plan from `begin_step` until the optimizer step finishes it."""
        if self.engine.plan is None:
            self._window_losses = []
            self._grad_norm = None
            self._step_started = time.perf_counter()
            return self.engine.begin_step()
        return self.engine.plan

    def _forward_only_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None
    ) -> torch.Tensor:
        """`Trainer.training_step` without the backward: the same context-parallel set-up, train modes
        and loss scaling (so the logged loss is comparable across phases), under no_grad."""
        cp_context, inputs = self._prepare_context_parallel_inputs(model, inputs)
        with cp_context():
            model.train()
            self.optimizer.train()
            with self.engine.timer.outside():  # the forward itself is the step's compute, not overhead
                inputs = self._prepare_inputs(inputs)
                with torch.no_grad(), self.compute_loss_context_manager():
                    loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        self._reshard_after_forward_only(model)
        if self.args.n_gpu > 1:
            loss = loss.mean()
        if not self._loss_is_scaled_for_ga(num_items_in_batch):
            loss = loss / self.current_gradient_accumulation_steps
        return loss.detach()

    def _reshard_after_forward_only(self, model: nn.Module) -> None:
        """Under FSDP2, free the parameters a forward without backward left unsharded.

        FSDP2 reshards the root module (and any module with `reshard_after_forward=False`) only after the
        backward. A forward under no_grad leaves them unsharded, and the next forward reuses that stale
        copy instead of all-gathering again, so a predicted update written into the shards in between
        would be invisible to it (measured: the loss after a predicted step drifted 1% from the
        single-process run). Resharding drops the copy; the next forward gathers the updated shards.
        """
        if not self.is_fsdp_enabled:
            return
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def _loss_is_scaled_for_ga(self, num_items_in_batch: torch.Tensor | int | None) -> bool:
        if self.loss_is_scaled_for_ga is not None:
            return bool(self.loss_is_scaled_for_ga)
        return (
            self.model_accepts_loss_kwargs and num_items_in_batch is not None
        ) or self.compute_loss_func is not None

    def _blind_step_loss(self) -> torch.Tensor:
        """A blind predicted step measures nothing: the logged loss carries the last measured value."""
        last = self.engine.last_measured_loss
        value = last if last is not None else float("nan")
        return torch.tensor(value / self.current_gradient_accumulation_steps, device=self.args.device)

    # ---- the optimizer-step point ---------------------------------------------------------------

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
                self._grad_norm = None if grad_norm is None else float(grad_norm)
        return grad_norm

    def _in_predicted_step(self) -> bool:
        return (
            self.engine is not None
            and self.engine.plan is not None
            and not self.engine.plan.phase.runs_backward
        )

    @_charged
    def _step_record(self) -> StepRecord:
        """What this optimizer step measured, for the engine: the loss averaged over ranks (so every rank
        feeds the engine the same value), the gradient norm, the learning rate."""
        loss = None
        if self._window_losses:
            total = torch.stack(self._window_losses).sum()
            if self.accelerator.num_processes > 1:
                total = self.accelerator.reduce(total, reduction="mean")
            loss = float(total)
        return StepRecord(loss, self._grad_norm, self._get_learning_rate())

    @_charged
    def _record_outcome(self, outcome: StepOutcome) -> None:
        """One timeline row per optimizer step (the plot, the model card and resume read it)."""
        self.hybrid_timeline.append(
            {
                "step": self.state.global_step + 1,
                "phase": outcome.phase.value,
                "loss": outcome.loss,
                "predicted_loss": self.engine.last_predicted_loss,
                "rolled_back": outcome.rolled_back,
                "level": int(outcome.level),
                "action": outcome.action.value,
                "seconds": time.perf_counter() - self._step_started,
            }
        )

    # ---- checkpoints: the hybrid state travels with every HF checkpoint --------------------------

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """Runs on every rank, before trainer_state.json is written, hub-pushed and rotated."""
        super()._save_optimizer_and_scheduler(output_dir)
        if self.engine is None:
            return
        shards = self.engine.shards
        if shards.sharded:  # every rank holds different shards: every rank writes its own files
            entry = save_sharded_engine_state(
                self.engine.state_dict(),
                output_dir,
                rank=shards.rank,
                gather=self._gather_over_shards,
                summary=self.engine.stats(),
            )
        else:
            entry = save_engine_state(
                self.engine.state_dict(),
                output_dir,
                write_files=self.args.should_save,
                summary=self.engine.stats(),
            )
        self._hybrid_state_callback().engine_state = entry
        if self.args.should_save:
            save_timeline(self.hybrid_timeline, output_dir)

    def _gather_over_shards(self, obj: Any) -> list[Any]:
        """`obj` of every rank of the engine's shard group, in rank order (a collective)."""
        gathered: list[Any] = [None] * self.engine.shards.world_size
        torch.distributed.all_gather_object(gathered, obj, group=self.engine.shards.group)
        return gathered

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        self._resume_checkpoint = checkpoint  # the engine is built (and restored) right after

    def _restore_engine(self, checkpoint: str) -> None:
        entry = read_engine_entry(checkpoint)
        if self.hybrid_args.hybrid_restart_engine:
            self._restart_engine(checkpoint, entry)
            return
        if entry is None:
            logger.warning(
                "hf_hybrid: %s has no hybrid state (saved by the plain Trainer?); the engine starts fresh "
                "with warmup at this step",
                checkpoint,
            )
            return
        shards = self.engine.shards
        problem = sharding_problem(entry, shards.world_size)
        if problem:
            raise HybridCheckpointError(f"cannot resume the hybrid engine from {checkpoint}: {problem}")
        state = load_engine_state(rank_pair(entry, shards.rank), checkpoint)
        try:
            self.engine.load_state_dict(state)
        except (ValueError, KeyError, TypeError) as exc:
            raise HybridCheckpointError(
                f"cannot resume the hybrid engine from {checkpoint}: {exc}. Resume with the same hybrid "
                "configuration and trainable parameters, or set `hybrid_restart_engine=True` to start afresh."
            ) from exc
        self.hybrid_timeline = load_timeline(checkpoint)

    def _restart_engine(self, checkpoint: str, entry: dict[str, Any] | None) -> None:
        """A new engine, not a new history: its learnt state starts over; the counters, the engine's time
        and peak bytes and the timeline of the run so far carry on (from the checkpoint's readable state,
        when it can be read)."""
        self.hybrid_timeline = load_timeline(checkpoint)
        carried = "the phase timeline"
        if entry is not None:
            try:
                tree = read_engine_tree(rank_pair(entry, 0), checkpoint)  # the same counters on every rank
                self.engine.continue_accounting(tree)
                carried = "the counters, the engine's time and peak bytes, and the phase timeline"
            except (HybridCheckpointError, KeyError, TypeError, ValueError) as exc:
                logger.warning(
                    "hf_hybrid: the counters of %s cannot be read (%s); they restart at 0", checkpoint, exc
                )
        logger.warning(
            "hf_hybrid: hybrid_restart_engine=True: a new engine from %s. The predictor, the loss "
            "forecaster, the horizon bandit, the residual history and the divergence statistics start over, "
            "with a new warmup of %d steps; %s carry on.",
            checkpoint,
            self.engine.config.schedule.warmup_steps,
            carried,
        )

    def _hybrid_state_callback(self) -> HybridStateCallback:
        """The callback whose state `trainer_state.json` carries. HF re-creates stateful callbacks when
        `restore_callback_states_from_checkpoint` is set; re-register ours so exactly one is saved."""
        if self._state_callback not in self.callback_handler.callbacks:
            self.callback_handler.pop_callback(HybridStateCallback)
            self.add_callback(self._state_callback)
        return self._state_callback

    # ---- what users see -------------------------------------------------------------------------

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Training logs get the `hybrid/*` metrics, so every reporter and `trainer_state.json` see them
        at the step of the training log.

        No per-rank reduction is needed here: every metric is computed by the engine from quantities that
        are already identical on every rank — the step loss is averaged over ranks before the engine sees
        it (`_step_record`), the gradient norm is of the synchronised gradients (under FSDP2 the norm of
        the whole gradient, which accelerate reduces over the shards), the parameters and so the updates
        and residuals are replicated (DDP) or sharded with every whole-tensor sum all-reduced by the
        engine (FSDP2), and counters follow the phase decisions, which every rank takes identically.
        """
        if self.engine is not None and "loss" in logs:
            with self.engine.timer.part("trainer"):
                logs.update({f"hybrid/{key}": value for key, value in self.engine.metrics().items()})
        if self.engine is not None and "train_runtime" in logs:  # the end-of-run metrics
            stats = self.hybrid_stats()
            logs.update({f"hybrid/{key}": float(stats[key]) for key in _SUMMARY_KEYS})
            logs["hybrid/engine_time_share"] = stats["timing"]["engine_time_share"]
        super().log(logs, start_time)

    def hybrid_stats(self) -> dict[str, Any]:
        """Plain dict: steps per phase, backward passes run/skipped, rollbacks, refusals, compute units,
        the engine's bytes (now and peak), the highest confidence against the threshold, and under
        `timing` the share of the step time that the hybrid machinery took — the engine and this
        trainer's hooks, in all (`engine_time_share`) and by part (`parts`); CPU time on CPU (see
        `engine.timing`), the only entry that varies run to run."""
        if self.engine is None:
            return {"enabled": False, "steps_per_phase": {p.value: 0 for p in Phase}, "backward_skipped": 0}
        stats = {"enabled": True, **self.engine.stats(), "timing": self.engine.timing()}
        stats["no_predict_reason"] = no_predict_reason(stats)
        return stats

    def _console_logs(self, logs: dict[str, Any]) -> dict[str, Any]:
        """The logs as the console shows them: `hybrid/*` keys folded into one `hybrid` entry (unless
        `hybrid_console_metrics="full"`); trackers and `trainer_state.json` get the full dict."""
        if self.engine is None:
            return logs
        if self.hybrid_args.hybrid_console_metrics == "full":  # every key, the phase by its name
            return {k: _phase_name(v) if k == "hybrid/phase" else v for k, v in logs.items()}
        shown = {key: value for key, value in logs.items() if not key.startswith("hybrid/")}
        if len(shown) < len(logs) and "train_runtime" not in logs:
            phase = self.engine.controller.phase
            shown["hybrid"] = console_line(phase.value if phase else None, self.engine.stats())
        return shown

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """HF's card (also the one `push_to_hub` writes), plus the "Hybrid training" section and the
        `hf-hybrid` tag, added after peft has updated an adapter's card (peft rewrites the tags)."""
        super().create_model_card(*args, **kwargs)
        if self.engine is None or not self.is_world_process_zero():
            return
        context = card_context(
            self.engine.stats(), self.engine.metrics(), self.hybrid_args.hybrid_dict(), self.hybrid_timeline
        )
        add_hybrid_section(
            os.path.join(self.args.output_dir, "README.md"),
            render_section(context),
            base_model=kwargs.get("finetuned_from"),
            local_base=None if kwargs.get("finetuned_from") else self._local_base_model(),
        )

    def _local_base_model(self) -> str | None:
        """The local directory a pretrained model (or a peft adapter's base) was loaded from, if any:
        transformers infers a card's base model only from a hub name."""
        model = self.accelerator.unwrap_model(self.model)
        peft_config = getattr(model, "peft_config", None)
        names = [getattr(c, "base_model_name_or_path", None) for c in (peft_config or {}).values()]
        names.append(getattr(getattr(model, "config", None), "_name_or_path", None))
        return next((name for name in names if isinstance(name, str) and name and os.path.isdir(name)), None)

    def _publish_timeline_plot(self) -> None:
        """World process zero: `output_dir/hybrid_timeline.png`, and the same image on the W&B run."""
        if self.engine is None or not self.hybrid_timeline or not self.is_world_process_zero():
            return
        try:
            path = plot_timeline(self.hybrid_timeline, os.path.join(self.args.output_dir, TIMELINE_PLOT_FILE))
        except (ImportError, OSError) as exc:  # the trained model matters more than its plot
            logger.warning("hf_hybrid: could not write the phase-timeline plot: %r", exc)
            return
        from transformers.integrations import WandbCallback

        for callback in self.callback_handler.callbacks:
            wandb = getattr(callback, "_wandb", None) if isinstance(callback, WandbCallback) else None
            if wandb is not None and getattr(callback, "_initialized", False) and wandb.run is not None:
                log_image_to_wandb(wandb, path, self.state.global_step)


_SUMMARY_KEYS = (
    "backward_skipped_fraction",
    "rollbacks",
    "predict_phases",
    "max_confidence",
    "engine_peak_bytes",
)


class _HybridStepCallback(TrainerCallback):
    """After each optimizer step, the timeline row; after the last, the timeline plot and the summary in
    the log (registered after the reporters, so a W&B run is still open for the plot)."""

    def __init__(self, trainer: HybridHFTrainer) -> None:
        self.trainer = trainer

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        optimizer = self.trainer.optimizer
        if self.trainer.engine is not None and isinstance(optimizer, HybridOptimizer):
            self.trainer._record_outcome(optimizer.last_outcome)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._publish_timeline_plot()
        if self.trainer.engine is not None and state.is_world_process_zero:
            logger.info(run_summary(self.trainer.hybrid_stats()))


class _HybridProgressCallback(ProgressCallback):
    """HF's tqdm callback: the phase and skipped share on the bar, the `hybrid/*` keys folded into one
    entry of the printed logs, and the summary after the last step."""

    def __init__(self, trainer: HybridHFTrainer) -> None:
        super().__init__()
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_step_end(args, state, control, **kwargs)
        engine = self.trainer.engine
        if engine is not None and self.training_bar is not None:
            with engine.timer.part("trainer"):
                phase = engine.controller.phase.value if engine.controller.phase else None
                self.training_bar.set_postfix(progress_postfix(phase, engine.stats()), refresh=False)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        super().on_log(args, state, control, logs=self.trainer._console_logs(logs or {}), **kwargs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_train_end(args, state, control, **kwargs)
        if state.is_world_process_zero and self.trainer.engine is not None:
            tqdm.write(run_summary(self.trainer.hybrid_stats()))


class _HybridPrinterCallback(PrinterCallback):
    """HF's plain console callback (`disable_tqdm=True`), with the same compact hybrid entry and summary."""

    def __init__(self, trainer: HybridHFTrainer) -> None:
        self.trainer = trainer

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        super().on_log(args, state, control, logs=self.trainer._console_logs(logs or {}), **kwargs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and self.trainer.engine is not None:
            print(run_summary(self.trainer.hybrid_stats()))  # the console, as PrinterCallback prints logs


def _phase_name(code: float) -> str:
    """`hybrid/phase` as the console shows it: the name of the phase whose `Phase.index` it is."""
    return list(Phase)[int(code)].value


def _check_not_empty(dataset: Any) -> None:
    """Name the cause (torch's sampler would only say `num_samples=0`), before any step is spent."""
    if dataset is not None and hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ValueError(
            "HybridHFTrainer: `train_dataset` is empty (0 examples), there is nothing to train on; "
            "pass a dataset with at least one example"
        )


def _wrap_with_peft(model: nn.Module | None, peft_config: Any) -> nn.Module:
    from peft import PeftModel, get_peft_model

    if model is None:
        raise ValueError("`peft_config` needs a `model` to wrap")
    if isinstance(model, PeftModel):
        raise ValueError(
            "the model is already a PeftModel and a `peft_config` was passed too; pass one or the other"
        )
    return get_peft_model(model, peft_config)
