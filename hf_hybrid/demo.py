"""`hf-hybrid demo`: the plain Trainer and HybridHFTrainer side by side on a small model, offline.

The table shows what the phase machine did, where the loss ended, and the measured wall time beside the
nominal compute, so that neither is read alone. A demonstration of the mechanism, not a benchmark.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, Trainer, TrainingArguments
from transformers.trainer_callback import ProgressCallback

from .args import HybridArgumentsMixin, HybridTrainingArguments
from .bench.measure.faults import LR_FACTOR, FaultWindow, fault_window, inject
from .data import stdlib_lm_datasets
from .tiny_models import tiny_gpt2, tiny_gpt2_config
from .trainer import HybridHFTrainer

logger = logging.getLogger(__name__)

RESULTS_FILE = "demo_results.json"
COMPUTE_NOTE = (
    "wall / plain is measured here (the engine's own work and a shared machine's load included); compute / "
    "plain counts forward-pass units by the nominal cost model (a real step 3, a checked predicted step 1, "
    "a blind one 0), what skipping a backward saves where it costs two forwards. On a CPU a backward costs "
    "about 0.64 of a forward, so a run can save compute and still take longer: read both."
)
NOT_A_BENCHMARK = (
    "This is a demo of the mechanism, not a benchmark (one seed, one learning rate, CPU wall-clock); "
    "`hf-hybrid bench` is where speed at equal quality is measured."
)

ARENA_COMMAND = (
    "hf-hybrid bench --model_name_or_path YOUR_MODEL --dataset YOUR_DATA.csv --methods plain "
    "hybrid-predict null freeze:3 (README: Does it pay on your task?)"
)


@dataclass(frozen=True)
class DemoSize:
    """Everything that `--size` chooses."""

    max_steps: int
    train_blocks: int
    eval_blocks: int
    logging_steps: int
    # Chosen so the phase machine visibly cycles: this model's measured confidence settles at 0.27-0.39
    # (seed 0), far below the library's 0.85, so the demo lowers the bar to where the skill is.
    hybrid: dict[str, Any] = field(default_factory=dict)


_DEMO_HYBRID = {
    "hybrid_warmup_steps": 50,
    "hybrid_full_steps": 10,
    "hybrid_max_predict_steps": 8,
    "hybrid_confidence_threshold": 0.3,
}
# The spike runs' hybrid trainer: never predicts (a skill of 1 is never measured), the spike guard at its
# default (`auto`, on wherever its copies fit; written out so that the demo's header names it).
GUARD_ONLY = {"hybrid_confidence_threshold": 1.0, "hybrid_spike_guard": "auto"}
SIZES: dict[str, DemoSize] = {
    "default": DemoSize(
        max_steps=600, train_blocks=4096, eval_blocks=128, logging_steps=60, hybrid=_DEMO_HYBRID
    ),
    # For the test suite: seconds, not minutes. Predict phases still happen (threshold 0).
    "tiny": DemoSize(
        max_steps=60,
        train_blocks=256,
        eval_blocks=16,
        logging_steps=20,
        hybrid={
            "hybrid_warmup_steps": 12,
            "hybrid_full_steps": 4,
            "hybrid_max_predict_steps": 4,
            "hybrid_min_history": 4,
            "hybrid_confidence_threshold": 0.0,
        },
    ),
}


def hybrid_defaults() -> dict[str, Any]:
    return {f.name: f.default for f in fields(HybridArgumentsMixin)}


def run_demo(
    size: str = "default",
    max_steps: int | None = None,
    output_dir: str | Path | None = None,
    seed: int = 0,
    learning_rate: float = 1e-3,
    batch_size: int = 16,
    json_path: str | Path | None = None,
    out: Callable[[str], None] = print,
    spike: bool = True,
) -> dict[str, Any]:
    """Train plain, then hybrid; with `spike`, plain and the spike guard alone again with the learning
    rate x30 for 3 steps at mid-run; print the table through `out`; return (and write) the results."""
    if size not in SIZES:
        raise ValueError(f"`size` must be one of {sorted(SIZES)}, got {size!r}")
    spec = SIZES[size]
    steps = spec.max_steps if max_steps is None else max_steps
    if steps < 1:
        raise ValueError(f"`max_steps` must be >= 1, got {steps}")
    output_dir = Path(tempfile.mkdtemp(prefix="hf_hybrid_demo_") if output_dir is None else output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    demo = Demo(spec, steps, seed, learning_rate, batch_size, output_dir, out)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on a busy 2-core machine were 4-14x slower (machine-facts)
    try:
        rows = demo.train_all(spike)
    finally:
        torch.set_num_threads(previous_threads)
    results = demo.results(size, rows)
    out("")
    for line in format_table(results):
        out(line)
    text = json.dumps(results, indent=2, default=str)
    (output_dir / RESULTS_FILE).write_text(text + "\n")
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(text + "\n")
    out(f"results: {output_dir / RESULTS_FILE}" + (f" and {json_path}" if json_path else ""))
    out(closing_line(results))
    return results


@dataclass
class Demo:
    """One demo: its runs share the seed, data, arguments and learning rate; only the trainer class, its
    settings and the injected fault differ."""

    spec: DemoSize
    steps: int
    seed: int
    learning_rate: float
    batch_size: int
    output_dir: Path
    out: Callable[[str], None]
    config: GPT2Config = field(default_factory=tiny_gpt2_config)

    def train_all(self, spike: bool) -> list[dict[str, Any]]:
        """Every run of the table, in order: (name, output folder, hybrid settings or None for plain)."""
        train, evaluation = stdlib_lm_datasets(
            self.config.n_positions, train_blocks=self.spec.train_blocks, eval_blocks=self.spec.eval_blocks
        )
        for line in _header(
            self.config, self.spec, self.steps, self.batch_size, self.learning_rate, self.seed
        ):
            self.out(line)
        burst = fault_window("lr_burst", self.steps)
        runs = [("plain", "plain", None), ("hybrid", "hybrid", self.spec.hybrid)]
        if spike:  # the guard alone: predict phases off, so the burst meets real steps in both runs
            label = f"lr x{LR_FACTOR:g} at step {burst.start + 1}"
            self.out(
                f"then with the learning rate x{LR_FACTOR:g} for steps {burst.start + 1}-{burst.start + 3}: "
                f"plain, and HybridHFTrainer with {GUARD_ONLY}"
            )
            runs += [
                (f"plain, {label}", "plain-spike", None),
                (f"spike guard only, {label}", "guard-spike", GUARD_ONLY),
            ]
        rows = []
        for name, folder, hybrid in runs:
            self.out(f"--- {name} run ---")
            args = self.arguments(self.output_dir / folder, hybrid)
            fault = burst if folder.endswith("spike") else None
            rows.append(_run_one(name, args, train, evaluation, fault))
        return rows

    def arguments(self, output_dir: Path, hybrid: dict[str, Any] | None) -> TrainingArguments:
        """The arguments every run shares; `hybrid` settings make them a hybrid run's (None: plain)."""
        common = dict(
            output_dir=str(output_dir),
            max_steps=self.steps,
            per_device_train_batch_size=self.batch_size,
            per_device_eval_batch_size=self.batch_size,
            learning_rate=self.learning_rate,
            seed=self.seed,
            logging_steps=max(1, min(self.spec.logging_steps, self.steps)),
            save_strategy="no",
            eval_strategy="no",
            report_to="none",
            use_cpu=True,
            dataloader_num_workers=0,
        )
        return TrainingArguments(**common) if hybrid is None else HybridTrainingArguments(**common, **hybrid)

    def results(self, size: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        plain_wall = rows[0]["wall_clock_s"]
        for row in rows:
            row["wall_clock_ratio"] = row["wall_clock_s"] / plain_wall if plain_wall > 0 else math.nan
        # the second plain run (the spike runs') trains the same steps at the same cost: how far its wall
        # time is from the first's is the clock's noise on this machine, measured, not assumed
        again = next((row for row in rows[1:] if row["run"].startswith("plain")), None)
        keys = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
        return {
            "size": size,
            "model": {k: getattr(self.config, k) for k in keys},
            "num_parameters": rows[0]["num_parameters"],
            "max_steps": self.steps,
            "batch_size": self.batch_size,
            "learning_rate": self.learning_rate,
            "seed": self.seed,
            "hybrid_settings": {**hybrid_defaults(), **self.spec.hybrid},
            "hybrid_settings_not_default": _not_default(self.spec.hybrid),
            "rows": rows,
            "wall_clock_noise": None if again is None else abs(again["wall_clock_ratio"] - 1.0),
            "note": NOT_A_BENCHMARK,
        }


def closing_line(results: dict[str, Any]) -> str:
    """The demo's last line: what its table shows, beside the clock's noise, and what judges a trick."""
    plain, hybrid = results["rows"][0], results["rows"][1]
    noise = results["wall_clock_noise"]
    measured = (
        f"two plain runs of the same steps were {noise:.1%} apart here: the clock's noise"
        if noise is not None
        else "no second plain run measured the clock's noise (--no-spike)"
    )
    return (
        f"The table shows the mechanism on one seed, not a verdict: the hybrid run took "
        f"{hybrid['wall_clock_ratio']:.2f}x plain's wall time ({measured}) and ended "
        f"{hybrid['eval_loss'] - plain['eval_loss']:+.4f} in eval loss against plain's; to judge a trick "
        f"on your own task, ask the arena: {ARENA_COMMAND}"
    )


def _not_default(hybrid: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in hybrid.items() if hybrid_defaults()[k] != v}


def _header(
    config: GPT2Config, spec: DemoSize, steps: int, batch_size: int, lr: float, seed: int
) -> list[str]:
    defaults = hybrid_defaults()
    changed = ", ".join(f"{k}={v} (default {defaults[k]})" for k, v in _not_default(spec.hybrid).items())
    return [
        f"hf-hybrid demo: GPT-2 {config.n_layer}x{config.n_embd} on Python-stdlib bytes, {steps} steps, "
        f"batch {batch_size}x{config.n_positions}, lr {lr:g}, seed {seed}, 1 torch thread",
        f"hybrid settings that differ from the library defaults: {changed or 'none'}",
    ]


def _run_one(
    name: str, args: TrainingArguments, train: Any, evaluation: Any, fault: FaultWindow | None = None
) -> dict[str, Any]:
    """Train one run of the table from the seed's initial weights; its row."""
    hybrid = isinstance(args, HybridTrainingArguments)
    model = tiny_gpt2(seed=args.seed)  # the same initial weights for every run
    trainer_cls = HybridHFTrainer if hybrid else Trainer
    trainer = trainer_cls(model=model, args=args, train_dataset=train, eval_dataset=evaluation)
    if fault is not None:
        inject(trainer, fault, args.seed)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(_ShortLogProgress())
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    row = {"run": name, **(_hybrid_row(trainer) if hybrid else _plain_row(int(trainer.state.global_step)))}
    row.update(
        eval_loss=float(trainer.evaluate()["eval_loss"]),
        wall_clock_s=wall,
        num_parameters=model.num_parameters(),
    )
    _save_json(Path(args.output_dir) / "log_history.json", trainer.state.log_history)
    return row


def _hybrid_row(trainer: HybridHFTrainer) -> dict[str, Any]:
    stats = trainer.hybrid_stats()
    _save_json(Path(trainer.args.output_dir) / "hybrid_timeline.json", trainer.hybrid_timeline)
    return {
        "steps": int(trainer.state.global_step),
        "steps_per_phase": dict(stats["steps_per_phase"]),
        "backward_run": stats["backward_run"],
        "backward_skipped": stats["backward_skipped"],
        "backward_skipped_fraction": stats["backward_skipped_fraction"],
        "compute_saved_fraction": stats["compute_saved_fraction"],
        "rollbacks": stats["rollbacks"],
        "restores": stats["restores"] if stats["spike_guard"] else None,
        "skips": stats["skips"] if stats["spike_guard"] else None,
        "hybrid_stats": stats,
    }


def _plain_row(steps: int) -> dict[str, Any]:
    return {
        "steps": steps,
        "steps_per_phase": None,
        "backward_run": steps,
        "backward_skipped": 0,
        "backward_skipped_fraction": 0.0,
        "compute_saved_fraction": 0.0,
        "rollbacks": 0,
        "restores": None,
        "skips": None,
    }


def format_table(results: dict[str, Any]) -> list[str]:
    """The comparison table, as lines."""
    headers = [
        "run",
        "steps",
        "warmup/full/predict/correct",
        "backward run",
        "backward skipped",
        "rollbacks",
        "restores",
        "skips",
        "eval loss",
        "wall s",
        "wall / plain",
        "compute / plain",
    ]
    body = []
    for row in results["rows"]:
        phases = row["steps_per_phase"]
        phase_text = (
            "/".join(str(phases[p]) for p in ("warmup", "full", "predict", "correct")) if phases else "-"
        )
        body.append(
            [
                row["run"],
                str(row["steps"]),
                phase_text,
                str(row["backward_run"]),
                f"{row['backward_skipped']} ({row['backward_skipped_fraction']:.1%})",
                str(row["rollbacks"]) if phases else "-",
                "-" if row.get("restores") is None else str(row["restores"]),
                "-" if row.get("skips") is None else str(row["skips"]),
                f"{row['eval_loss']:.4f}",
                f"{row['wall_clock_s']:.1f}",
                f"{row['wall_clock_ratio']:.2f}x",
                f"{1.0 - row['compute_saved_fraction']:.2f}x",
            ]
        )
    widths = [max(len(r[i]) for r in [headers, *body]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    rule = "-" * len(line(headers))
    return [line(headers), rule, *(line(r) for r in body), rule, COMPUTE_NOTE, results["note"]]


def _save_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=str) + "\n")


class _ShortLogProgress(ProgressCallback):
    """The usual tqdm bar (HybridHFTrainer puts the phase in its postfix), with one short line per log."""

    KEYS = (
        ("loss", "loss", "{:.3f}"),
        ("hybrid/confidence", "confidence", "{:.2f}"),
        ("hybrid/update_skill", "skill", "{:.2f}"),
        ("hybrid/backward_skipped_fraction", "skipped", "{:.0%}"),
        ("hybrid/rollbacks", "rollbacks", "{:.0f}"),
    )

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if not state.is_world_process_zero or self.training_bar is None or not logs or "loss" not in logs:
            return
        parts = [f"step {state.global_step}"]
        for key, label, fmt in self.KEYS:
            value = logs.get(key)
            if isinstance(value, int | float):
                parts.append(f"{label} {fmt.format(value)}")
        self.training_bar.write("  ".join(parts))
