"""`selective-backprop:keep=0.5`: Jiang et al. 2019, in Composer's form and defaults.

A selective step runs a no-grad forward for per-sample losses, draws `keep` of the samples (the one at
loss percentile q with weight q^(1/keep - 1)) and trains on those only; from `start` to `end` of training,
every `every`-th step. Its null control (`rule=uniform`) draws as many uniformly: the same cost.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from transformers import Trainer

from .base import SEPARATE_RUNS, STEP, Method, TrialContext

RULES = ("loss", "uniform")


class SelectiveBackprop(Method):
    """Its window is a share of the whole run, so each budget is a separate run."""

    name: ClassVar[str] = "selective-backprop"
    summary: ClassVar[str] = (
        "backward only on the higher-loss part of each batch (keep=0.5, start=0.5, end=0.9, every=2, "
        "rule=loss|uniform)"
    )
    option_help: ClassVar[dict[str, str]] = {
        "keep": "share of each batch back-propagated, in (0, 1]",
        "start": "fraction of training where selection starts, in [0, 1]",
        "end": "fraction of training where it ends, in [start, 1]",
        "every": "select on every n-th step, >= 1",
        "rule": "loss (rank-weighted draw) or uniform (the null control)",
    }
    budget_schedule: ClassVar[str] = SEPARATE_RUNS

    def __post_init__(self) -> None:
        super().__post_init__()
        self.keep = self.option("keep", float, 0.5, lambda v: 0 < v <= 1, "in (0, 1]")
        self.start = self.option("start", float, 0.5, lambda v: 0 <= v <= 1, "in [0, 1]")
        self.end = self.option("end", float, 0.9, lambda v: self.start <= v <= 1, f"in [{self.start}, 1]")
        self.every = self.option("every", int, 2, lambda v: v >= 1, ">= 1")
        self.rule = self.option("rule", str, "loss", lambda v: v in RULES, f"one of {list(RULES)}")

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        kwargs = ctx.trainer_kwargs(model, train, evaluation)
        return SelectiveBackpropTrainer(args=ctx.training_arguments(), selection=self, **kwargs)

    def selective(self, step: int, total: int) -> bool:
        return self.start * total <= step < self.end * total and step % self.every == 0

    def step_counts(self, trainer: Trainer, steps: int) -> dict[str, int]:
        selective = trainer.selective_steps
        return {self.kind("selective"): selective, STEP: steps - selective}

    def own_kinds(self) -> tuple[str, ...]:
        return (self.kind("selective"),)

    def calibration_variant(self, kind: str) -> Method:
        variant = SelectiveBackprop(self.spec, dict(self.options))
        variant.start, variant.end, variant.every = 0.0, 1.0, 1
        return variant

    def null_spec(self) -> str | None:
        if self.rule == "uniform":
            return None
        options = {**self.options, "rule": "uniform"}
        return f"{self.name}:" + ",".join(f"{k}={v}" for k, v in options.items())

    def describe_run(self, trainer: Trainer) -> dict[str, Any]:
        return {"selective_steps": trainer.selective_steps}

    def pick(self, losses: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Indices of the samples to back-propagate."""
        n = losses.shape[0]
        n_keep = max(1, round(self.keep * n))
        if self.rule == "uniform":
            return torch.randperm(n, generator=generator)[:n_keep]
        order = torch.argsort(losses.detach().float().cpu())
        percentiles = (torch.arange(n, dtype=torch.float64) + 0.5) / n
        weights = percentiles ** (1.0 / self.keep - 1.0)
        picked = torch.multinomial(weights, n_keep, replacement=False, generator=generator)
        return order[picked]


class SelectiveBackpropTrainer(Trainer):
    def __init__(self, *args: Any, selection: SelectiveBackprop, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.selection = selection
        self.selective_steps = 0
        self.generator = torch.Generator().manual_seed(self.args.seed)
        self._counted_step = -1

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        step = self.state.global_step
        if not self.selection.selective(step, self.state.max_steps):
            return super().training_step(model, inputs, num_items_in_batch)
        inputs = self._prepare_inputs(inputs)
        labels = inputs["labels"]
        with torch.no_grad():
            logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
        chosen = self.selection.pick(per_sample_loss(logits, labels), self.generator).to(labels.device)
        n = labels.shape[0]
        subset = {
            k: v[chosen] if torch.is_tensor(v) and v.shape[:1] == (n,) else v for k, v in inputs.items()
        }
        if num_items_in_batch is not None:
            num_items_in_batch = count_items(subset["labels"], logits.dim() == 3)
        if step != self._counted_step:  # one count per optimizer step, whatever the accumulation
            self._counted_step = step
            self.selective_steps += 1
        return super().training_step(model, subset, num_items_in_batch)


def count_items(labels: torch.Tensor, causal: bool) -> torch.Tensor:
    if causal:
        return (labels[:, 1:] != -100).sum()
    return torch.tensor(labels.shape[0])


def per_sample_loss(logits: torch.Tensor, labels: torch.Tensor, with_counts: bool = False) -> Any:
    """Mean cross-entropy per sample (shifted for a causal LM), with each one's scored tokens if asked."""
    if logits.dim() == 3:
        logits, labels = logits[:, :-1].float(), labels[:, 1:]
        token = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
        counts = (labels != -100).sum(1)
        mean = token.sum(1) / counts.clamp(min=1)
    else:
        mean = F.cross_entropy(logits.float(), labels, reduction="none")
        counts = torch.ones_like(labels)
    return (mean, counts) if with_counts else mean
