"""Selective backprop (Jiang et al. 2019; Composer's `SelectiveBackprop`) against the plain frontier.

    python benchmarks/experiments/selective_backprop.py --task clm_stdlib --size quick \
        --out benchmarks/experiments/results/sb_clm.json --variant keep50:keep=0.5,start=0.1,every=1

A selective step first runs a no-grad forward over the whole batch for per-sample losses, then draws
`keep` of the samples with a probability rising with their loss rank (Composer's rule: the sample at
loss percentile q is drawn with weight q^(1/keep - 1)) and runs the usual forward + backward on those
only. Cost in forward units: 1 (scoring) + 3 * keep, against 3 for a real step. Selective steps run
from `start` to `end` (fractions of training), on every `every`-th step. Prototype: it lives here and
goes into the library only if it beats the tuned plain Trainer.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
import torch.nn.functional as F
from transformers import Trainer
from transformers.trainer_callback import PrinterCallback
from variants import experiment_parser, plain_frontier, write_results  # same folder: run as a script

from hf_hybrid.bench.frontier import speedup
from hf_hybrid.bench.runner import RunSpec, _arguments, _Clock
from hf_hybrid.bench.tasks import get_task


class SelectiveBackpropTrainer(Trainer):
    def __init__(self, *args: Any, keep: float, start: float, end: float, every: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.keep, self.start, self.end, self.every = keep, start, end, every
        self.units = 0.0
        self.selective_steps = 0
        self.generator = torch.Generator().manual_seed(self.args.seed)

    def _selective(self) -> bool:
        step, total = self.state.global_step, self.state.max_steps
        return self.start * total <= step < self.end * total and step % self.every == 0

    def training_step(self, model, inputs, num_items_in_batch=None):
        if not self._selective():
            self.units += 3.0
            return super().training_step(model, inputs, num_items_in_batch)
        inputs = self._prepare_inputs(inputs)
        labels = inputs["labels"]
        with torch.no_grad():
            logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
        losses = per_sample_loss(logits, labels)
        n = losses.shape[0]
        n_keep = max(1, round(self.keep * n))
        order = torch.argsort(losses.cpu())
        percentiles = (torch.arange(n, dtype=torch.float64) + 0.5) / n
        weights = percentiles ** (1.0 / self.keep - 1.0)
        picked = torch.multinomial(weights, n_keep, replacement=False, generator=self.generator)
        chosen = order[picked].to(labels.device)
        subset = {
            k: v[chosen] if torch.is_tensor(v) and v.shape[:1] == (n,) else v for k, v in inputs.items()
        }
        if num_items_in_batch is not None:
            num_items_in_batch = _count_items(subset["labels"], logits.dim() == 3)
        self.units += 1.0 + 3.0 * n_keep / n
        self.selective_steps += 1
        return super().training_step(model, subset, num_items_in_batch)


def _count_items(labels: torch.Tensor, causal: bool) -> torch.Tensor:
    if causal:
        return (labels[:, 1:] != -100).sum()
    return torch.tensor(labels.shape[0])


def per_sample_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per sample: shifted for a causal LM ([B, T, V]), plain for a classifier."""
    if logits.dim() == 3:
        logits, labels = logits[:, :-1].float(), labels[:, 1:]
        token = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
        counts = (labels != -100).sum(1).clamp(min=1)
        return token.sum(1) / counts
    return F.cross_entropy(logits.float(), labels, reduction="none")


def run_selective(spec: RunSpec, options: dict[str, float]) -> dict[str, Any]:
    task = get_task(spec.task)
    size = task.size(spec.size)
    model, train, evaluation = task.build(size, spec.seed)
    lr = task.learning_rate * spec.lr_multiplier
    with tempfile.TemporaryDirectory() as tmp:
        args = _arguments(RunSpec(**{**spec.__dict__}), tmp, size.steps, size.batch_size, lr, task)
        clock = _Clock()
        trainer = SelectiveBackpropTrainer(
            model=model, args=args, train_dataset=train, eval_dataset=evaluation, callbacks=[clock],
            keep=options.get("keep", 0.5), start=options.get("start", 0.5), end=options.get("end", 0.9),
            every=int(options.get("every", 2)),
        )  # fmt: skip
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    return {
        "eval_loss": clock.curve[-1]["eval_loss"],
        "units": trainer.units,
        "seconds": clock.train_seconds(),
        "selective_steps": trainer.selective_steps,
    }


def main() -> None:
    parser = experiment_parser("name:keep=0.5,start=0.5,end=0.9,every=2")
    opts = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    def log(result, label):
        print(f"{label}: loss {result.eval_loss:.4f} {result.train_seconds:.1f}s", flush=True)

    best, frontier, sweep = plain_frontier(opts.task, opts.size, opts.seed, opts.multipliers, log)
    points_units = [(r.compute_units, r.eval_loss) for r in frontier]
    points_time = [(r.train_seconds, r.eval_loss) for r in frontier]
    rows = []
    for item in opts.variant:
        name, _, fields = item.partition(":")
        options = {k: float(v) for k, v in (f.split("=") for f in fields.split(",") if f)}
        spec = RunSpec(opts.task, opts.size, "plain", opts.seed, best.spec.lr_multiplier)
        result = run_selective(spec, options)
        units = speedup(points_units, result["eval_loss"], result["units"])
        time = speedup(points_time, result["eval_loss"], result["seconds"])
        row = {
            "variant": name,
            "options": options,
            **result,
            "speedup_units": units.ratio,
            "speedup_units_kind": units.kind,
            "speedup_time": time.ratio,
            "speedup_time_kind": time.kind,
        }
        rows.append(row)
        print(
            f"{name}: loss {result['eval_loss']:.4f} units {result['units']:.0f} {result['seconds']:.1f}s "
            f"speed-up units {units.ratio:.2f}x ({units.kind}) time {time.ratio:.2f}x",
            flush=True,
        )
    write_results(opts, best, frontier, sweep, rows)


if __name__ == "__main__":
    main()
