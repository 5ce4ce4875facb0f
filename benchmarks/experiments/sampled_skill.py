"""Issue 13: does the sleeping engine's sampled skill track the skill on the whole parameters?

    python benchmarks/experiments/sampled_skill.py --size full --seeds 0 1 2 \
        --out benchmarks/experiments/results/sampled_skill

While it sleeps the engine scores its predictor on a seeded sample of the coordinates (`CoordinateSample`,
~1/400 of them, at most 65,536 per tensor) instead of the whole trainable parameters. This script trains
each benchmark task with the plain `Trainer` and, beside it, scores the same predictor twice after every
observed step — once on the whole parameters, once on the sample — with the engine's own classes
(`RealUpdateTracker`, the registered predictor, `delta_dot_products`, `Residual.skill`). Two cadences:
every step (how an awake engine observes) and every `dormant_every` steps with the averaged update (how a
sleeping engine observes). Reported per task, cadence and predictor over the seeds: the error of a single
step's skill, the error of the 16-step mean (the window the confidence is computed on; the number that
decides whether the engine wakes) and the error of the run's mean skill. The plain run is not changed by
any of this (the scoring only reads the weights and the optimizer state).

Writes `sampled_skill.json`, `sampled_skill.md` (the table) and `sampled_skill.png` (full vs sampled
skill along one seed's run per task) to --out.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from hf_hybrid.bench.runner import PresetRun, run  # noqa: E402
from hf_hybrid.engine.config import EngineConfig  # noqa: E402
from hf_hybrid.engine.predictor import build_predictor, delta_dot_products  # noqa: E402
from hf_hybrid.engine.residuals import Corrector, Residual, ResidualStore  # noqa: E402
from hf_hybrid.engine.sample import CoordinateSample  # noqa: E402
from hf_hybrid.engine.updates import RealUpdateTracker  # noqa: E402

WINDOW = 16  # the corrector's confidence window (`Corrector.window`)
TASKS = ("clm_stdlib", "minilm_cls", "minilm_lora")


def _residual(predicted: Any, real: Any) -> Residual | None:
    if predicted is None:
        return None
    pd, pp, dd = delta_dot_products(predicted, real)
    return Residual(0, "full", 1, pd, pp, dd)


class _Side:
    """What one engine would know: its tracker, its predictor and its confidence (store + corrector)."""

    def __init__(self, params: dict[str, torch.Tensor], optimizer: Any, predictor: str, sample: Any) -> None:
        self.tracker = RealUpdateTracker(params, sample)
        self.predictor = build_predictor(predictor, params=params, optimizer=optimizer, sample=sample)
        self.store, self.corrector = ResidualStore(), Corrector()
        self.pending: Any = None

    def guess(self) -> None:
        """Before the optimizer step, as the engine guesses (a replay of the optimizer reads its state)."""
        self.pending = self.predictor.predict(1)

    def observe(self) -> tuple[float, float] | None:
        """(skill of this step's guess at scale 1, the engine's confidence after it), or None unscored."""
        guess, self.pending = self.pending, None
        delta = self.tracker.take()
        residual = _residual(guess, delta)
        self.predictor.observe(delta)
        if residual is None:
            return None
        self.store.add(residual)
        self.corrector.update(residual)
        return residual.skill(1.0), self.corrector.confidence(self.store)


class _Scorer:
    """One predictor scored on the whole parameters and on the sample, at one observation cadence."""

    def __init__(
        self, params: dict[str, torch.Tensor], optimizer: Any, predictor: str, cadence: int, seed: int
    ):
        sample = CoordinateSample({n: p.shape for n, p in params.items()}, seed)
        self.fraction = sample.fraction
        self.cadence = cadence
        self.sides = (_Side(params, optimizer, predictor, None), _Side(params, optimizer, predictor, sample))
        self.rows: list[tuple[int, float, float, float, float]] = []  # step, skill and confidence x2

    def before_step(self, step: int) -> None:
        if step % self.cadence == 0:
            for side in self.sides:
                side.guess()

    def after_step(self, step: int) -> None:
        if step % self.cadence:
            for side in self.sides:
                side.tracker.skip()
            return
        full, sampled = (side.observe() for side in self.sides)
        if full is not None and sampled is not None:
            self.rows.append((step, full[0], sampled[0], full[1], sampled[1]))


class _SkillProbe(TrainerCallback):
    def __init__(self, predictors: tuple[str, ...], cadences: tuple[int, ...], seed: int) -> None:
        self.trainer: Any = None
        self.predictors, self.cadences, self.seed = predictors, cadences, seed
        self.scorers: dict[tuple[str, int], _Scorer] = {}

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.scorers:
            return
        model = self.trainer.model
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        optimizer = self.trainer.optimizer
        while hasattr(optimizer, "optimizer"):  # accelerate's wrapper
            optimizer = optimizer.optimizer
        for predictor in self.predictors:
            for cadence in self.cadences:
                self.scorers[predictor, cadence] = _Scorer(params, optimizer, predictor, cadence, self.seed)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for scorer in self.scorers.values():
            scorer.before_step(state.global_step + 1)  # the step about to be taken

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for scorer in self.scorers.values():
            scorer.after_step(state.global_step)


def _errors(rows: list[tuple[int, float, float, float, float]], skip: int) -> dict[str, float]:
    """Errors of the sampled estimates, past the first `skip` scored steps (the first updates of a run
    change fastest, and no predict phase can open during the engine's warmup)."""
    rows = rows[skip:]
    full, sampled = [r[1] for r in rows], [r[2] for r in rows]
    confidence_errors = [abs(r[3] - r[4]) for r in rows[WINDOW - 1 :]]  # full windows only
    return {
        "scored_steps": len(rows),
        "skill_error_mean": statistics.fmean(abs(f - s) for f, s in zip(full, sampled, strict=True)),
        "confidence_error_mean": statistics.fmean(confidence_errors) if confidence_errors else float("nan"),
        "confidence_error_max": max(confidence_errors) if confidence_errors else float("nan"),
        "confidence_full_max": max(r[3] for r in rows),
        "confidence_sampled_max": max(r[4] for r in rows),
        "run_mean_full": statistics.fmean(full),
        "run_mean_error": abs(statistics.fmean(full) - statistics.fmean(sampled)),
    }


def _mean_sd(values: list[float]) -> str:
    values = [v for v in values if v == v]  # a run shorter than one window has no window error
    if not values:
        return "n/a"
    if len(values) < 2:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def _max(values: list[float]) -> str:
    values = [v for v in values if v == v]
    return f"{max(values):.3f}" if values else "n/a"


def _table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| task | predictor | observed | sampled share | scored steps | skill at scale 1, whole (run mean) "
        "| its error (one step, mean) | confidence error: mean / max | max confidence: whole / sampled |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted(
        {(r["task"], r["predictor"], r["cadence"]) for r in results},
        key=lambda k: (TASKS.index(k[0]), k[1], k[2]),
    )
    for task, predictor, cadence in keys:
        rows = [r for r in results if (r["task"], r["predictor"], r["cadence"]) == (task, predictor, cadence)]
        e = [r["errors"] for r in rows]

        def column(key: str) -> list[float]:
            return [x[key] for x in e]  # noqa: B023 - used at once, inside the loop

        confidence = f"{_mean_sd(column('confidence_error_mean'))} / {_max(column('confidence_error_max'))}"
        peak = f"{_max(column('confidence_full_max'))} / {_max(column('confidence_sampled_max'))}"
        observed = "every step (awake)" if cadence == 1 else f"every {cadence}th, averaged (asleep)"
        lines.append(
            f"| `{task}` | {predictor} | {observed} | {rows[0]['fraction']:.2%} | {e[0]['scored_steps']} "
            f"| {_mean_sd(column('run_mean_full'))} | {_mean_sd(column('skill_error_mean'))} "
            f"| {confidence} | {peak} |"
        )
    seeds = sorted({r["seed"] for r in results})
    lines.append("")
    lines.append(
        f"Seeds {seeds}; `a ± b`: mean and standard deviation over the seeds; max: over all seeds and steps. "
        f"Confidence: the engine's, clamp(mean skill of the last {WINDOW} guesses at the corrector's scale, "
        "0, 1), computed by each side from its own residuals, as a sleeping (sampled) or awake (whole) "
        "engine does."
    )
    return "\n".join(lines)


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r["seed"] == min(x["seed"] for x in results) and r["cadence"] == 1]
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 2.6 * len(shown)), squeeze=False)
    for ax, r in zip(axes[:, 0], shown, strict=True):
        steps = [row[0] for row in r["rows"]]
        ax.plot(steps, [row[3] for row in r["rows"]], lw=0.8, label="whole parameters")
        ax.plot(steps, [row[4] for row in r["rows"]], lw=0.8, label=f"sample ({r['fraction']:.2%})")
        ax.set_title(f"{r['task']}, {r['predictor']}, seed {r['seed']}: the engine's confidence", fontsize=9)
        ax.set_ylim(-0.05, 1.05)
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--size", default="full", choices=("tiny", "quick", "full"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--predictors", nargs="+", default=["ema", "adam"])
    parser.add_argument("--skip", type=int, default=None, help="scored steps left out at the start")
    parser.add_argument("--out", required=True)
    opts = parser.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    cadences = (1, EngineConfig().dormant_every)
    results: list[dict[str, Any]] = []
    for task in opts.tasks:
        for seed in opts.seeds:
            probe = _SkillProbe(tuple(opts.predictors), cadences, seed)
            result = run(PresetRun(task, opts.size, "plain", seed, eval_points=1), callbacks=[probe])
            for (predictor, cadence), scorer in probe.scorers.items():
                skip = opts.skip if opts.skip is not None else len(scorer.rows) // 10
                if len(scorer.rows) <= skip:
                    print(f"{task} seed {seed} {predictor} every {cadence}: too few scored steps", flush=True)
                    continue
                errors = _errors(scorer.rows, skip)
                results.append({
                    "task": task, "seed": seed, "predictor": predictor, "cadence": cadence,
                    "fraction": scorer.fraction, "skip": skip, "errors": errors, "rows": scorer.rows,
                })  # fmt: skip
                print(
                    f"{task} seed {seed} {predictor} every {cadence}: eval loss {result.eval_loss:.4f}, "
                    f"confidence error {errors['confidence_error_mean']:.3f} "
                    f"(max {errors['confidence_error_max']:.3f})",
                    flush=True,
                )
    table = _table(results)
    print(table)
    command = " ".join(["python", *sys.argv])
    (out / "sampled_skill.json").write_text(json.dumps({"command": command, "results": results}, indent=1))
    (out / "sampled_skill.md").write_text(f"`{command}`\n\n{table}\n")
    _plot(results, out / "sampled_skill.png")


if __name__ == "__main__":
    main()
