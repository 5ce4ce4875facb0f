"""Issue 12, stage 1: does stopping the backward below the settled blocks beat the lr-tuned plain Trainer?

    OMP_NUM_THREADS=1 python benchmarks/experiments/layer_phases.py --task minilm_cls --steps 400 \
        --out benchmarks/experiments/results/layer_phases/minilm_cls.json --stage calibrate sweep frontier

Stages (each appends its runs to --out, one JSON rewrite per finished run; runs already there are skipped,
so the script resumes where it stopped):

- `calibrate`: CPU time of a training step (the real `Trainer`, 3 untimed + 15 timed steps) with the
  first p blocks of the freezable prefix frozen, p = 0 .. all; the cost of a step with p frozen is
  3 * t(p) / t(0) compute units (plain = 3).
- `sweep`: plain `Trainer` at the full budget, seed 0, lr multipliers (widened by x2 while the best is at
  an edge). `frontier`: at the best rate, seeds 0,1,2 at 1/4, 1/2, 3/4, 1 of the budget (own schedules).
- `static`: the bottom k blocks (and the embeddings) frozen for the whole run, seed 0 over k and lr;
  `static-seeds`: seeds 1, 2 at the best (k, lr) of seed 0.
- `adaptive`: AutoFreeze-style freezing of a growing prefix decided every F steps from measured signals,
  `--policy` strings (see `Policy`), seed 0; `adaptive-seeds`: seeds 1, 2 at the best policy of seed 0.
- `report`: tables (markdown) and plots from the JSON.

The plain runs carry a monitor that records the same per-block signals without acting; its own CPU time
is subtracted from theirs (it is not part of plain training).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402

from hf_hybrid.bench.frontier import envelope, speedup  # noqa: E402
from hf_hybrid.bench.tasks import NUM_PACKAGES, TASKS, TaskSize, classification_data, minilm_classifier  # noqa: E402

torch.set_num_threads(1)

BUDGETS = (0.25, 0.5, 0.75, 1.0)
SEEDS = (0, 1, 2)
LAYERS = 6  # all-MiniLM-L6-v2


# ----------------------------------------------------------------------------------------------- model


def build(task: str, seed: int, seq: int, n_train: int, n_eval: int):
    """The task's model and data; LoRA as in hf_hybrid.bench.tasks._build_lora (copied: it takes a size)."""
    size = TaskSize(steps=0, batch_size=0, seq_len=seq, train_examples=n_train, eval_examples=n_eval)
    train, evaluation = classification_data(size)
    model = minilm_classifier(seed, NUM_PACKAGES)
    if task == "minilm_lora":
        from peft import LoraConfig, TaskType, get_peft_model

        config = LoraConfig(task_type=TaskType.SEQ_CLS, r=8, lora_alpha=16, target_modules=["query", "value"])
        torch.manual_seed(seed)
        model = get_peft_model(model, config)
    return model, train, evaluation


def freezable_blocks(model: torch.nn.Module) -> list[tuple[str, list[torch.nn.Parameter]]]:
    """The prefix that can be frozen, input side first: embeddings, encoder layers 0 .. L-2 (each with its
    trainable parameters; blocks with none, e.g. the embeddings under LoRA, are left out). The top layer,
    pooler and head are never frozen."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    prefix = "base_model.model." if any(n.startswith("base_model.model.") for n, _ in named) else ""
    names = [f"{prefix}bert.embeddings"] + [f"{prefix}bert.encoder.layer.{i}" for i in range(LAYERS - 1)]
    blocks = []
    for block in names:
        params = [p for n, p in named if n.startswith(block + ".")]
        if params:
            blocks.append((block.removeprefix(prefix), params))
    return blocks


def freeze(blocks, upto: int) -> None:
    for _, params in blocks[:upto]:
        for p in params:
            p.requires_grad_(False)


def data_fingerprint(train, evaluation) -> str:
    h = hashlib.sha256()
    for ds in (train, evaluation):
        h.update(json.dumps([ds[i]["input_ids"] for i in range(0, len(ds), max(1, len(ds) // 64))]).encode())
        h.update(str(len(ds)).encode())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------------------- callbacks


class Clock(TrainerCallback):
    """Process CPU time (one torch thread) and wall-clock from train begin to the last step end; the
    evaluation happens after training. `exclude` callbacks' own seconds are subtracted (the plain runs'
    monitor)."""

    def __init__(self) -> None:
        self.start = self.wall_start = self.end = self.wall_end = 0.0
        self.step_ends: list[float] = []
        self.exclude: list[Any] = []

    def on_train_begin(self, args, state, control, **kw):
        self.start, self.wall_start = time.process_time(), time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.end, self.wall_end = time.process_time(), time.perf_counter()
        self.step_ends.append(self.end)

    def seconds(self) -> float:
        return self.end - self.start - sum(c.own_seconds for c in self.exclude)

    def wall(self) -> float:
        return self.wall_end - self.wall_start - sum(c.own_wall for c in self.exclude)


@dataclass(frozen=True)
class Policy:
    """When to freeze the next block of the prefix.

    signal "update": s_b = |theta_b(t) - theta_b(t-F)| / (|theta_b(t)| * sum of lr over the window), an
      lr-normalised update ratio (for Adam, how coherent the block's steps were over the window); the
      reference is its largest value in the first `ref` windows; the lowest trainable block is frozen when
      s_b / ref_b < tau for `patience` windows in a row, then the next one is tested in the same decision.
    signal "plateau": the same s_b; the lowest trainable block is frozen when its relative change between
      consecutive windows, |s_b(w) - s_b(w-1)| / s_b(w-1), stays below tau for `patience` windows in a
      row (its update dynamics have stopped changing), then the next one is tested in the same decision.
    signal "gradnorm" (AutoFreeze 2021): g_b = sum over the window of the block's gradient norm; rate_b =
      |g_b(w) - g_b(w-1)| / g_b(w-1); the lowest trainable block is frozen when its rate is below the
      `tau`-quantile of the rates of all trainable freezable blocks (AutoFreeze: the median), one block per
      decision, from window `ref`+1 on.
    `max_frozen`: cap on the prefix (None: all freezable blocks)."""

    signal: str = "update"
    every: int = 20
    ref: int = 2
    tau: float = 0.5
    patience: int = 1
    max_frozen: int | None = None

    @staticmethod
    def parse(text: str) -> Policy:
        fields = {}
        for item in filter(None, text.split(",")):
            key, _, value = item.partition("=")
            kind = Policy.__dataclass_fields__[key].type
            fields[key] = (
                value if "str" in str(kind) else (float(value) if "float" in str(kind) else int(value))
            )
        return Policy(**fields)

    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in asdict(self).items() if v is not None)


class Freezer(TrainerCallback):
    """Measures per-block signals every F optimizer steps; with `act`, freezes a growing input-side prefix
    (requires_grad=False: autograd stops at the lowest trainable block, AdamW skips parameters whose grad
    is None). Without `act` it is the plain runs' monitor, and its own CPU time is reported separately."""

    def __init__(self, blocks, policy: Policy, act: bool, grad_signal: bool) -> None:
        self.blocks, self.policy, self.act, self.grad_signal = blocks, policy, act, grad_signal
        self.frozen = 0  # length of the frozen prefix
        self.limit = len(blocks) if policy.max_frozen is None else min(policy.max_frozen, len(blocks))
        self.own_seconds = self.own_wall = 0.0
        self.snap: list[list[torch.Tensor]] = []
        self.lr_sum = 0.0
        self.grad_acc = [0.0] * len(blocks)
        self.prev_grad: list[float | None] = [None] * len(blocks)
        self.ref = [0.0] * len(blocks)
        self.prev_update: list[float | None] = [None] * len(blocks)
        self.below = [0] * len(blocks)
        self.window = 0
        self.trace: list[dict[str, Any]] = []  # per window: step, lr_sum, per-block signals
        self.frozen_at: dict[str, int] = {}
        self.frozen_drift = 0.0
        self.steps_at: list[int] = [0] * (len(blocks) + 1)  # optimizer steps run with p blocks frozen

    def _timed(fn):  # noqa: N805
        def wrapper(self, *a, **kw):
            t0, w0 = time.process_time(), time.perf_counter()
            try:
                return fn(self, *a, **kw)
            finally:
                self.own_seconds += time.process_time() - t0
                self.own_wall += time.perf_counter() - w0

        return wrapper

    @_timed
    def on_train_begin(self, args, state, control, **kw):
        self.snap = [[p.detach().clone() for p in params] for _, params in self.blocks]

    @_timed
    def on_pre_optimizer_step(self, args, state, control, **kw):
        if not self.grad_signal:
            return
        for b in range(self.frozen, len(self.blocks)):
            grads = [p.grad for p in self.blocks[b][1] if p.grad is not None]
            if grads:
                self.grad_acc[b] += float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))

    @_timed
    def on_optimizer_step(self, args, state, control, optimizer=None, **kw):
        self.lr_sum += float(optimizer.param_groups[0]["lr"])

    @_timed
    def on_step_end(self, args, state, control, **kw):
        self.steps_at[self.frozen] += 1
        if state.global_step % self.policy.every or state.global_step >= state.max_steps:
            return
        self.window += 1
        row: dict[str, Any] = {"step": state.global_step, "lr_sum": self.lr_sum, "update": {}, "gradnorm": {}}
        rates: dict[int, float] = {}
        for b in range(self.frozen, len(self.blocks)):
            name, params = self.blocks[b]
            with torch.no_grad():
                moved = math.sqrt(
                    sum(float((p - s).pow(2).sum()) for p, s in zip(params, self.snap[b], strict=True))
                )
                size = math.sqrt(sum(float(p.pow(2).sum()) for p in params))
                for p, s in zip(params, self.snap[b], strict=True):
                    s.copy_(p)
            signal = moved / max(size * self.lr_sum, 1e-30)
            row["update"][name] = signal
            if self.window <= self.policy.ref:
                self.ref[b] = max(self.ref[b], signal)
            if self.prev_update[b]:
                row.setdefault("plateau", {})[name] = abs(signal - self.prev_update[b]) / self.prev_update[b]
            self.prev_update[b] = signal
            if self.grad_signal:
                g = self.grad_acc[b]
                if self.prev_grad[b]:
                    rates[b] = abs(g - self.prev_grad[b]) / self.prev_grad[b]
                    row["gradnorm"][name] = rates[b]
                self.prev_grad[b], self.grad_acc[b] = g, 0.0
        self.lr_sum = 0.0
        if self.act and self.window > self.policy.ref:
            self._decide(state.global_step, row, rates)
        row["frozen"] = self.frozen
        self.trace.append(row)

    def on_train_end(self, args, state, control, **kw):
        if self.act:  # a frozen block must not have moved since it was frozen
            with torch.no_grad():
                self.frozen_drift = max(
                    (
                        float((p - s).abs().max())
                        for b in range(self.frozen)
                        for p, s in zip(self.blocks[b][1], self.snap[b], strict=True)
                    ),
                    default=0.0,
                )

    def _decide(self, step: int, row: dict[str, Any], rates: dict[int, float]) -> None:
        if self.policy.signal in ("update", "plateau"):
            for b in range(self.frozen, self.limit):  # windows in a row below tau, for every trainable block
                name = self.blocks[b][0]
                if self.policy.signal == "update":
                    value = row["update"][name] / max(self.ref[b], 1e-30)
                else:
                    value = row.get("plateau", {}).get(name, math.inf)
                self.below[b] = self.below[b] + 1 if value < self.policy.tau else 0
            while self.frozen < self.limit and self.below[self.frozen] >= self.policy.patience:
                self._freeze_next(step)
        elif self.policy.signal == "gradnorm":
            if self.frozen < self.limit and self.frozen in rates and len(rates) > 1:
                values = sorted(rates.values())
                cut = values[min(len(values) - 1, int(self.policy.tau * len(values)))]
                if rates[self.frozen] < cut:
                    self._freeze_next(step)
        else:
            raise ValueError(f"unknown signal {self.policy.signal!r}")

    def _freeze_next(self, step: int) -> None:
        name, params = self.blocks[self.frozen]
        for p in params:
            p.requires_grad_(False)
            p.grad = None
        self.frozen_at[name] = step  # snap[b] now holds the block as frozen: checked at train end
        self.frozen += 1


class Timer(TrainerCallback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.process_time())


# ----------------------------------------------------------------------------------------------- runs


def arguments(out: str, steps: int, batch: int, lr: float, seed: int) -> TrainingArguments:
    return TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=batch,
        per_device_eval_batch_size=64,
        learning_rate=lr,
        weight_decay=0.0,
        eval_strategy="no",
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        seed=seed,
        data_seed=seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=True,
    )


def accuracy(pred) -> dict[str, float]:
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def train_once(opts, spec: dict[str, Any], costs: list[float] | None) -> dict[str, Any]:
    """One run: spec has method (plain|static|adaptive), seed, lr, budget, k (static), policy (adaptive)."""
    steps = max(1, round(opts.steps * spec["budget"]))
    model, train, evaluation = build(opts.task, spec["seed"], opts.seq, opts.train, opts.eval)
    blocks = freezable_blocks(model)
    if spec["method"] == "static":
        freeze(blocks, spec["frozen"])
    policy = Policy.parse(spec.get("policy", "")) if spec["method"] == "adaptive" else Policy()
    grad_signal = spec["method"] == "plain" or policy.signal == "gradnorm"  # the monitor records both
    freezer = Freezer(blocks, policy, act=spec["method"] == "adaptive", grad_signal=grad_signal)
    if spec["method"] == "static":
        freezer.frozen = spec["frozen"]
    clock = Clock()
    if spec["method"] == "plain":
        clock.exclude.append(freezer)
    callbacks = [clock] if spec["method"] == "static" else [clock, freezer]
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            model=model,
            args=arguments(tmp, steps, opts.batch, spec["lr"], spec["seed"]),
            train_dataset=train,
            eval_dataset=evaluation,
            callbacks=callbacks,
            compute_metrics=accuracy,
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        metrics = trainer.evaluate()
    if spec["method"] == "static":
        steps_at = [0] * (len(blocks) + 1)
        steps_at[spec["frozen"]] = steps
    else:
        steps_at = freezer.steps_at
    units = sum(n * c for n, c in zip(steps_at, costs, strict=True)) if costs else None
    return {
        "spec": spec,
        "steps": steps,
        "cpu_seconds": clock.seconds(),
        "wall_seconds": clock.wall(),
        "monitor_seconds": freezer.own_seconds if spec["method"] == "plain" else 0.0,
        "signal_seconds": freezer.own_seconds if spec["method"] == "adaptive" else 0.0,
        "units": units,
        "eval_loss": float(metrics["eval_loss"]),
        "eval_accuracy": float(metrics["eval_accuracy"]),
        "steps_at_frozen": steps_at,
        "frozen_at": freezer.frozen_at,
        "frozen_drift": freezer.frozen_drift,
        "trace": freezer.trace if spec["method"] != "static" else [],
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def calibrate(opts) -> dict[str, Any]:
    """CPU seconds per training step with the first p freezable blocks frozen, p = 0 .. all."""
    model, _, _ = build(opts.task, 0, opts.seq, opts.train, opts.eval)
    n_blocks = len(freezable_blocks(model))
    del model
    table = []
    for p in range(n_blocks + 1):
        model, train, evaluation = build(opts.task, 0, opts.seq, opts.train, opts.eval)
        blocks = freezable_blocks(model)
        freeze(blocks, p)
        timer = Timer()
        lr = TASKS[opts.task].learning_rate
        with tempfile.TemporaryDirectory() as tmp:
            args = arguments(tmp, opts.calib_warm + opts.calib_steps, opts.batch, lr, 0)
            trainer = Trainer(model=model, args=args, train_dataset=train, callbacks=[timer])
            trainer.remove_callback(PrinterCallback)
            trainer.train()
        deltas = [b - a for a, b in zip(timer.times[:-1], timer.times[1:], strict=True)][
            opts.calib_warm - 1 :
        ]
        table.append(
            {
                "frozen": p,
                "frozen_blocks": [name for name, _ in blocks[:p]],
                "median_s": statistics.median(deltas),
                "mean_s": statistics.fmean(deltas),
                "stdev_s": statistics.stdev(deltas) if len(deltas) > 1 else 0.0,
                "deltas": deltas,
            }
        )
        print(
            f"calibrate p={p} {table[-1]['median_s']:.3f}s/step (sd {table[-1]['stdev_s']:.3f})", flush=True
        )
    base = table[0]["median_s"]
    for row in table:
        row["units_per_step"] = 3 * row["median_s"] / base
    return {
        "blocks": [row["frozen_blocks"][-1] if row["frozen_blocks"] else None for row in table],
        "table": table,
    }


# ----------------------------------------------------------------------------------------------- storage


def load(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    return {"runs": []}


def save(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def key(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True)


def find(data, **want) -> list[dict[str, Any]]:
    return [r for r in data["runs"] if all(r["spec"].get(k) == v for k, v in want.items())]


def ensure(opts, path: Path, data: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """Run `spec` unless its result is already stored; store it as soon as it finishes."""
    for r in data["runs"]:
        if key(r["spec"]) == key(spec):
            return r
    costs = [row["units_per_step"] for row in data["calibration"]["table"]] if "calibration" in data else None
    print(f"[{time.strftime('%H:%M:%S')}] run {key(spec)}", flush=True)
    result = train_once(opts, spec, costs)
    data = load(path)  # reread: the file is the source of truth
    data.setdefault("runs", []).append(result)
    save(path, data)
    frozen = result["frozen_at"] or ""
    print(
        f"    loss {result['eval_loss']:.4f} acc {result['eval_accuracy']:.3f} "
        f"cpu {result['cpu_seconds']:.1f}s "
        f"wall {result['wall_seconds']:.1f}s units {result['units']} frozen {frozen}",
        flush=True,
    )
    return result


# ----------------------------------------------------------------------------------------------- stages


def best_lr_sweep(opts, path, data, method: str, extra: dict[str, Any], base_lr: float, mults) -> float:
    """Seed-0 full-budget runs over lr = base * m, widened by x2 while the best sits at an edge."""
    mults = sorted(mults)
    while True:
        for m in mults:
            data = load(path)
            ensure(opts, path, data, {"method": method, "seed": 0, "lr": base_lr * m, "budget": 1.0, **extra})
        data = load(path)
        losses = {
            m: find(data, method=method, seed=0, lr=base_lr * m, budget=1.0, **extra)[0]["eval_loss"]
            for m in mults
        }
        best = min(losses, key=losses.get)
        if best == mults[0] and best / 2 >= opts.min_mult:
            mults = [best / 2, *mults]
        elif best == mults[-1] and best * 2 <= opts.max_mult:
            mults = [*mults, best * 2]
        else:
            return base_lr * best


def plain_best_lr(data) -> float:
    sweep = [r for r in find(data, method="plain", seed=0, budget=1.0)]
    return min(sweep, key=lambda r: r["eval_loss"])["spec"]["lr"]


def stage(opts, name: str, path: Path) -> None:
    data = load(path)
    config = {k: getattr(opts, k) for k in ("task", "steps", "batch", "seq", "train", "eval")}
    if "config" in data and data["config"] != config:
        sys.exit(f"{path} holds runs of another configuration: {data['config']} != {config}")
    if "config" not in data:
        _, train, evaluation = build(opts.task, 0, opts.seq, opts.train, opts.eval)
        data["config"] = config
        data["data"] = {
            "train": len(train),
            "eval": len(evaluation),
            "fingerprint": data_fingerprint(train, evaluation),
        }
        save(path, data)
    base_lr = TASKS[opts.task].learning_rate
    if name == "calibrate":
        if "calibration" not in data:
            data["calibration"] = calibrate(opts)
            save(path, data)
        return
    if "calibration" not in data:
        sys.exit("run --stage calibrate first (compute units need it)")
    if name == "sweep":
        best_lr_sweep(opts, path, data, "plain", {}, base_lr, opts.multipliers)
    elif name == "frontier":
        lr = plain_best_lr(data)
        for seed in opts.frontier_seeds:
            for budget in BUDGETS:
                ensure(opts, path, load(path), {"method": "plain", "seed": seed, "lr": lr, "budget": budget})
    elif name == "static":
        lr = plain_best_lr(data)

        def static(frozen: int, m: float) -> dict[str, Any]:
            spec = {"method": "static", "seed": 0, "lr": lr * m, "budget": 1.0, "frozen": frozen}
            return ensure(opts, path, load(path), spec)

        for frozen in opts.static_frozen:  # every prefix at the plain best rate first
            static(frozen, 1.0)
        data = load(path)
        ranked = sorted(opts.static_frozen, key=lambda f: -speed(data, static(f, 1.0)))
        for frozen in ranked[: opts.static_top]:  # larger rates for the best prefixes, widened at the edge
            losses = {1.0: static(frozen, 1.0)["eval_loss"]}
            for m in opts.static_mults:
                losses[m] = static(frozen, m)["eval_loss"]
            while min(losses, key=losses.get) == max(losses) and max(losses) * 2 <= opts.max_mult:
                m = max(losses) * 2
                losses[m] = static(frozen, m)["eval_loss"]
    elif name == "static-seeds":  # the best (prefix, lr) of seed 0: largest speed-up, then lowest loss
        data = load(path)
        runs = find(data, method="static", seed=0, budget=1.0)
        best = min(runs, key=lambda r: (-round(speed(data, r), 3), r["eval_loss"]))
        for seed in SEEDS[1:]:
            ensure(opts, path, load(path), {**best["spec"], "seed": seed})
    elif name == "adaptive":
        lr = plain_best_lr(data)
        for policy in opts.policy:
            for m in opts.adaptive_mults:
                ensure(
                    opts,
                    path,
                    load(path),
                    {
                        "method": "adaptive",
                        "seed": 0,
                        "lr": lr * m,
                        "budget": 1.0,
                        "policy": Policy.parse(policy).label(),
                    },
                )
    elif name == "adaptive-seeds":  # the best policy of seed 0 among those that froze a block at all
        data = load(path)
        runs = [r for r in find(data, method="adaptive", seed=0, budget=1.0) if r["frozen_at"]]
        best = min(runs, key=lambda r: (-round(speed(data, r), 3), r["eval_loss"]))
        for seed in SEEDS[1:]:
            ensure(opts, path, load(path), {**best["spec"], "seed": seed})
    elif name == "report":
        report(opts, path)
    else:
        sys.exit(f"unknown stage {name!r}")


# ----------------------------------------------------------------------------------------------- report


def frontier_points(data, seed: int, clock: str) -> list[tuple[float, float]]:
    lr = plain_best_lr(data)
    return [(r[clock], r["eval_loss"]) for r in find(data, method="plain", seed=seed, lr=lr)]


def speed(data, run: dict[str, Any], clock: str = "units"):
    points = frontier_points(data, run["spec"]["seed"], clock)
    if not points or run[clock] is None:
        return math.nan
    return speedup(points, run["eval_loss"], run[clock]).ratio


def fmt_speed(data, run, clock) -> str:
    points = frontier_points(data, run["spec"]["seed"], clock)
    if len(points) < len(BUDGETS):
        return "–"
    s = speedup(points, run["eval_loss"], run[clock])
    mark = {"lower_bound": ">", "upper_bound": "<"}.get(s.kind, "")
    return f"{mark}{s.ratio:.2f}x"


def report(opts, path: Path) -> None:
    data = load(path)
    cal = data["calibration"]["table"]
    lines = [
        f"## {opts.task}: N={opts.steps}, batch {opts.batch}x{opts.seq}, train {data['data']['train']}, "
        f"eval {data['data']['eval']}",
        "",
        "Calibration (CPU s per step, median of the timed steps):",
        "",
        "| frozen prefix | s/step | sd | units/step |",
        "|---|---|---|---|",
    ]
    for row in cal:
        label = "none" if not row["frozen_blocks"] else f"… {row['frozen_blocks'][-1]} ({row['frozen']})"
        lines.append(
            f"| {label} | {row['median_s']:.3f} | {row['stdev_s']:.3f} | {row['units_per_step']:.2f} |"
        )
    lines += [
        "",
        "Plain lr sweep (seed 0, full budget):",
        "",
        "| lr | eval loss | acc | CPU s |",
        "|---|---|---|---|",
    ]
    for r in sorted(find(data, method="plain", seed=0, budget=1.0), key=lambda r: r["spec"]["lr"]):
        lines.append(
            f"| {r['spec']['lr']:.2g} | {r['eval_loss']:.4f} | {r['eval_accuracy']:.3f} | "
            f"{r['cpu_seconds']:.0f} |"
        )
    if find(data, method="plain"):
        lr = plain_best_lr(data)
        lines += [
            "",
            f"Plain frontier at lr {lr:.2g} (eval loss / CPU s / units):",
            "",
            "| seed | " + " | ".join(f"{b:g} N" for b in BUDGETS) + " |",
            "|---" * (len(BUDGETS) + 1) + "|",
        ]
        finals = []
        for seed in SEEDS:
            cells = []
            for b in BUDGETS:
                rr = find(data, method="plain", seed=seed, lr=lr, budget=b)
                cells.append(
                    f"{rr[0]['eval_loss']:.4f} / {rr[0]['cpu_seconds']:.0f} / {rr[0]['units']:.0f}"
                    if rr
                    else "–"
                )
                if rr and b == 1.0:
                    finals.append(rr[0]["eval_loss"])
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
        if len(finals) > 1:
            lines.append(
                f"\nPlain at N: seed spread (max-min) {max(finals) - min(finals):.4f}, "
                f"sd {statistics.stdev(finals):.4f}"
            )
    lines += [
        "",
        "Methods (speed-up at equal eval loss against the same seed's plain frontier; `>` a lower bound):",
        "",
        "| method | lr | frozen / policy | seed | eval loss | acc | CPU s | units | x CPU | x units "
        "| frozen at |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["runs"]:
        s = r["spec"]
        if s["method"] == "plain" and s["budget"] != 1.0:
            continue
        what = s.get("policy", s.get("frozen", ""))
        lines.append(
            f"| {s['method']} | {s['lr']:.2g} | {what} | {s['seed']} | {r['eval_loss']:.4f} | "
            f"{r['eval_accuracy']:.3f} | "
            f"{r['cpu_seconds']:.0f} | {r['units']:.0f} | {fmt_speed(data, r, 'cpu_seconds')} | "
            f"{fmt_speed(data, r, 'units')} | {r['frozen_at'] or ''} |"
        )
    lines += summary(data)
    text = "\n".join(lines) + "\n"
    out = path.with_name(path.stem + "_tables.md")
    out.write_text(text)
    print(text)
    plot(data, path.with_name(path.stem + ".png"))


def summary(data) -> list[str]:
    """One row per configuration (spec without the seed): loss, speed-ups per seed and their medians."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in data["runs"]:
        s = r["spec"]
        if s["budget"] != 1.0 or (s["method"] == "plain" and s["lr"] != plain_best_lr(data)):
            continue
        groups.setdefault(key({k: v for k, v in s.items() if k != "seed"}), []).append(r)
    lines = [
        "",
        "Summary (full budget; per seed 0/1/2; median over the seeds run):",
        "",
        "| method | lr | frozen / policy | eval loss | x CPU time | x units | median CPU | median units "
        "| pooled CPU | pooled units |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lr = plain_best_lr(data)
    pooled: dict[str, list[tuple[float, float]]] = {}
    for clock in ("cpu_seconds", "units"):  # the seeds' mean plain cost and loss at each budget
        for b in BUDGETS:
            rr = [find(data, method="plain", seed=seed, lr=lr, budget=b) for seed in SEEDS]
            if all(rr):
                mean_cost = statistics.fmean(x[0][clock] for x in rr)
                pooled.setdefault(clock, []).append(
                    (mean_cost, statistics.fmean(x[0]["eval_loss"] for x in rr))
                )
    for runs in groups.values():
        runs = sorted(runs, key=lambda r: r["spec"]["seed"])
        s = runs[0]["spec"]
        what = s.get("policy", s.get("frozen", ""))
        cpu = [speed(data, r, "cpu_seconds") for r in runs]
        units = [speed(data, r, "units") for r in runs]
        losses = " / ".join(f"{r['eval_loss']:.4f}" for r in runs)

        def pooled_speed(clock: str, runs=runs) -> str:  # mean loss and cost of 3 seeds on the mean frontier
            if len(runs) < len(SEEDS) or len(pooled.get(clock, [])) < len(BUDGETS):
                return "–"
            mean_loss = statistics.fmean(r["eval_loss"] for r in runs)
            sp = speedup(pooled[clock], mean_loss, statistics.fmean(r[clock] for r in runs))
            return {"lower_bound": ">", "upper_bound": "<"}.get(sp.kind, "") + f"{sp.ratio:.2f}x"

        lines.append(
            f"| {s['method']} | {s['lr']:.2g} | {what} | {losses} | "
            f"{' / '.join(fmt_speed(data, r, 'cpu_seconds') for r in runs)} | "
            f"{' / '.join(fmt_speed(data, r, 'units') for r in runs)} | "
            f"{statistics.median(cpu):.2f}x | {statistics.median(units):.2f}x | "
            f"{pooled_speed('cpu_seconds')} | {pooled_speed('units')} |"
        )
    return lines


def plot(data, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lr = plain_best_lr(data)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, clock in zip(axes, ("cpu_seconds", "units"), strict=True):
        for seed, color in zip(SEEDS, ("C0", "C1", "C2"), strict=True):
            pts = envelope(frontier_points(data, seed, clock))
            if pts:
                ax.plot(
                    [c for c, _ in pts],
                    [v for _, v in pts],
                    "-o",
                    color=color,
                    label=f"plain lr {lr:.2g}, seed {seed}",
                )
            for r in find(data, seed=seed, budget=1.0):
                s = r["spec"]
                if s["method"] == "static":
                    ax.plot(r[clock], r["eval_loss"], "s", color=color, mfc="none")
                    ax.annotate(f"k{s['frozen']}@{s['lr']:.2g}", (r[clock], r["eval_loss"]), fontsize=6)
                elif s["method"] == "adaptive":
                    ax.plot(r[clock], r["eval_loss"], "^", color=color)
        ax.set_xlabel("CPU s (training)" if clock == "cpu_seconds" else "compute units (calibrated)")
        ax.set_ylabel("final eval loss")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[0].set_title("plain frontier (lines), static (squares), adaptive (triangles)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", default="minilm_cls", choices=["minilm_cls", "minilm_lora"])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--train", type=int, default=4096)
    parser.add_argument("--eval", type=int, default=1024)
    parser.add_argument("--calib-warm", type=int, default=3)
    parser.add_argument("--calib-steps", type=int, default=15)
    parser.add_argument("--multipliers", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--min-mult", type=float, default=1 / 16)
    parser.add_argument("--max-mult", type=float, default=64.0)
    parser.add_argument(
        "--static-frozen",
        type=int,
        nargs="+",
        default=[1, 3, 4, 5, 6],
        help="frozen prefix lengths (full FT: 1 = embeddings, 1 + k = embeddings + k blocks)",
    )
    parser.add_argument("--static-mults", type=float, nargs="+", default=[2.0], help="x the plain best lr")
    parser.add_argument("--static-top", type=int, default=2, help="prefixes tried at --static-mults")
    parser.add_argument(
        "--policy", action="append", default=[], help="Policy fields, e.g. signal=update,tau=0.5"
    )
    parser.add_argument("--adaptive-mults", type=float, nargs="+", default=[1.0])
    parser.add_argument("--frontier-seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--stage", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    path = Path(opts.out)
    for name in opts.stage:
        print(f"== stage {name}", flush=True)
        stage(opts, name, path)


if __name__ == "__main__":
    main()
