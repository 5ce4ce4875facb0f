"""The arena's protocol, the same for every method on every task.

1. Price the kinds of step (`calibration.py`).
2. Sweep the plain `Trainer`'s learning rate at the full budget on the first seed (widened by x2 while
   the best rate sits at an edge: a best rate at the edge means the baseline was not tuned).
3. At the best rate, the plain frontier: complete runs at 1/4, 1/2, 3/4 (and all) of the budget, each
   with its own fully decayed schedule.
4. Every method at the plain best rate and x2 (or the multipliers given), with its null control.
5. The methods within 10% of winning on the first seed (`verdicts.NEAR_WIN`) run the other seeds at
   their chosen rate, next to those seeds' plain frontiers.
6. Verdicts (`verdicts.py`). The record is written after every run: the same command resumes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..data import DataError
from .calibration import Calibration, calibrate
from .methods import NULL, STEP, Method, parse_method
from .record import Record, run_key
from .runner import RunResult, run_trial
from .task import BenchTask
from .verdicts import (
    BUDGETS,
    NEAR_WIN,
    best_plain_multiplier,
    chosen_multiplier,
    frontier,
    speedups,
    verdicts,
)

logger = logging.getLogger(__name__)

SWEEP_MULTIPLIERS = (0.5, 1.0, 2.0, 4.0)
METHOD_MULTIPLIERS = (1.0, 2.0)
MAX_WIDENINGS = 2
MIN_STEPS = 4  # the 1/4 frontier point must be at least one step


@dataclass(frozen=True)
class Protocol:
    seeds: Sequence[int] = (0,)
    lr_multipliers: Sequence[float] = SWEEP_MULTIPLIERS
    method_lr_multipliers: Sequence[float] = METHOD_MULTIPLIERS
    widen: int = MAX_WIDENINGS
    eval_points: int = 4
    warm_steps: int = 2
    timed_steps: int = 8

    def check(self, task: BenchTask) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise DataError(f"`--seeds` must be distinct seeds, at least one, got {list(self.seeds)}")
        for flag, values in (
            ("--lr_multipliers", self.lr_multipliers),
            ("--method_lr_multipliers", self.method_lr_multipliers),
        ):
            if not values or any(not v > 0 for v in values):
                raise DataError(f"`{flag}` must be positive numbers, at least one, got {list(values)}")
        if task.max_steps < MIN_STEPS:
            raise DataError(
                f"`--max_steps` {task.max_steps} is too small for the plain frontier: its 1/4 point would be "
                f"{round(task.max_steps / 4)} steps; use --max_steps >= {MIN_STEPS}"
            )


def parse_methods(specs: Sequence[str]) -> tuple[list[Method], bool]:
    """The methods listed (plain, the judge, is always run and not listed twice), and whether their null
    controls were asked for (`null`). Duplicate or unknown specs are refused."""
    if len(set(specs)) != len(specs):
        raise DataError(f"`--methods` lists a method twice: {list(specs)}")
    with_nulls = NULL in specs
    methods = [parse_method(spec) for spec in specs if spec not in (NULL, "plain")]
    if with_nulls and not any(m.null_spec() for m in methods):
        raise DataError(
            "`null` adds the null control of the other methods listed, and none of them has one "
            "(hybrid, hybrid-predict and selective-backprop do)"
        )
    return methods, with_nulls


class Arena:
    """Runs the protocol for one task into one record."""

    def __init__(
        self,
        task: BenchTask,
        methods: Sequence[Method],
        with_nulls: bool,
        protocol: Protocol,
        record: Record,
        echo: Callable[[str], None] = print,
    ) -> None:
        self.task, self.protocol, self.record, self.echo = task, protocol, record, echo
        self.methods = list(methods)
        self.nulls = {m.spec: parse_method(m.null_spec()) for m in methods if with_nulls and m.null_spec()}
        self.calibration: Calibration | None = None
        self.bar: tqdm | None = None
        self.est_total = self.est_done = self.began = 0.0

    # ---- the protocol --------------------------------------------------------------------------

    def run(self) -> None:
        self.protocol.check(self.task)
        model = self.task.build_model(self.protocol.seeds[0])
        for method in [*self.methods, *self.nulls.values()]:
            method.check_model(model)
        del model
        self._calibrate()
        first = self.protocol.seeds[0]
        self._announce()
        self.est_total, self.est_done, self.began = self._estimate_seconds(), 0.0, time.perf_counter()
        self.bar = tqdm(
            total=round(self.est_total),
            unit="s",
            desc="arena",
            dynamic_ncols=True,
            disable=None,
            bar_format="{l_bar}{bar}| est. {n_fmt}/{total_fmt} s [{elapsed}<{remaining}]",
        )
        try:
            for multiplier in self.protocol.lr_multipliers:
                self._plain(first, multiplier, 1.0, "sweep")
            self._widen(first)
            best = best_plain_multiplier(self.record.runs, first)
            for budget in BUDGETS[:-1]:
                self._plain(first, best, budget, "frontier")
            for method in self.methods:
                for factor in self.protocol.method_lr_multipliers:
                    self._method(method, first, best * factor)
            near = [m for m in self.methods if self._near_win(m, first, best)]
            for seed in self.protocol.seeds[1:] if near else ():
                for budget in BUDGETS:
                    self._plain(seed, best, budget, "frontier")
                for method in near:
                    self._method(method, seed, chosen_multiplier(self.record.runs, method.spec, first, best))
        finally:
            self.bar.close()
            self.bar = None
        self._judge()

    def _widen(self, seed: int) -> None:
        for _ in range(self.protocol.widen):
            sweep = [r for r in self.record.runs if r["role"] == "sweep" and r["seed"] == seed]
            tried = sorted(r["lr_multiplier"] for r in sweep)
            best = best_plain_multiplier(self.record.runs, seed)
            if best == tried[-1]:
                self._plain(seed, best * 2, 1.0, "sweep")
            elif best == tried[0]:
                self._plain(seed, best / 2, 1.0, "sweep")
            else:
                return

    def _near_win(self, method: Method, seed: int, best: float) -> bool:
        multiplier = chosen_multiplier(self.record.runs, method.spec, seed, best)
        run = next(
            r
            for r in self.record.runs
            if r["method"] == method.spec and r["seed"] == seed and r["lr_multiplier"] == multiplier
        )
        return speedups(frontier(self.record.runs, seed, best), run)["speedup_units"] >= NEAR_WIN

    def _plain(self, seed: int, multiplier: float, budget: float, role: str) -> dict[str, Any]:
        return self._trial(parse_method("plain"), seed, multiplier, budget, role)

    def _method(self, method: Method, seed: int, multiplier: float) -> None:
        run = self._trial(method, seed, multiplier, 1.0, "method")
        null = self.nulls.get(method.spec)
        if null is not None:
            replay = run["details"].get("phases") if null.replays_parent else None
            self._trial(
                null,
                seed,
                multiplier,
                1.0,
                "null",
                replays=run["key"] if null.replays_parent else None,
                replay=replay,
            )

    # ---- one run, resumable ----------------------------------------------------------------------

    def _trial(
        self,
        method: Method,
        seed: int,
        multiplier: float,
        budget: float,
        role: str,
        replays: str | None = None,
        replay: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        steps = max(1, round(self.task.max_steps * budget))
        lr = self.task.learning_rate * multiplier
        key = run_key(method.spec, lr, seed, steps, replays)
        found = self.record.find(key)
        if found is not None:
            return found
        estimate = self._run_estimate(method, steps)
        self.est_total = max(self.est_total, self.est_done + estimate)  # widening, other seeds: unplanned
        if self.bar is not None:
            self.bar.total = round(self.est_total)
            self.bar.set_description(f"{method.spec} lr x{multiplier:g} seed {seed} {steps} steps")
        started = time.perf_counter()
        result = run_trial(
            self.task,
            method,
            learning_rate=lr,
            seed=seed,
            steps=steps,
            eval_points=self.protocol.eval_points,
            replay=replay,
        )
        run = self._as_record(result, key, role, multiplier, budget, replays)
        self.record.add(run)
        self.est_done += estimate
        if self.bar is not None:
            self.bar.update(round(estimate))
        line = (
            f"{method.spec:<28} {role:<8} lr x{multiplier:<5g} seed {seed} {steps:>5} steps  eval loss "
            f"{run['eval_loss']:.4f}  {run['units']:9.0f} units  {run['seconds']:7.1f} s"
            f" ({time.perf_counter() - started:.0f} s wall{self._eta()})"
        )
        self._say(line)
        if run["note"]:
            self._say(f"  note: {run['note']}")
        return run

    def _eta(self) -> str:
        """The planned runs' time left, at the pace measured so far (estimates scaled by reality)."""
        left = self.est_total - self.est_done
        if left <= 0 or self.est_done <= 0:
            return ""
        pace = (time.perf_counter() - self.began) / self.est_done
        return f"; {_duration(left * pace)} left as planned"

    def _say(self, line: str) -> None:
        """A line between the bar's refreshes (the bar is off when the output is not a terminal)."""
        if self.bar is not None and not self.bar.disable:
            tqdm.write(line)
        else:
            self.echo(line)

    def _as_record(
        self, result: RunResult, key: str, role: str, multiplier: float, budget: float, replays: str | None
    ) -> dict[str, Any]:
        price = self.calibration.price
        curve = [
            {**{k: v for k, v in p.items() if k != "counts"}, "units": price(p["counts"])}
            for p in result.curve
        ]
        return {
            "key": key,
            "method": result.method,
            "role": role,
            "learning_rate": result.learning_rate,
            "lr_multiplier": multiplier,
            "seed": result.seed,
            "budget": budget,
            "steps": result.steps,
            "eval_loss": result.eval_loss,
            "units": price(result.step_counts),
            "seconds": result.train_seconds,
            "wall_seconds": result.wall_seconds,
            "clock": result.clock,
            "step_counts": result.step_counts,
            "curve": curve,
            "details": result.details,
            "note": result.note,
            "trainable_bytes": result.trainable_bytes,
            "engine_peak_bytes": result.engine_peak_bytes,
            "device_peak_bytes": result.device_peak_bytes,
            "replays": replays,
        }

    # ---- calibration, estimate, verdicts ----------------------------------------------------------

    def _calibrate(self) -> None:
        saved = self.record.data.get("calibration")
        known = Calibration.from_dict(saved) if saved else None
        self.echo("calibrating: timing a forward pass, a plain step and each method's own steps ...")
        self.calibration = calibrate(
            self.task,
            [*self.methods, *self.nulls.values()],
            known=known,
            warm_steps=self.protocol.warm_steps,
            timed_steps=self.protocol.timed_steps,
        )
        self.record.data["calibration"] = self.calibration.to_dict()
        self.record.save()
        units = ", ".join(f"{k} {v:.2f}" for k, v in self.calibration.to_dict()["units"].items())
        self.echo(
            f"prices in forward units (a forward pass = {self.calibration.forward_seconds * 1e3:.1f} ms): "
            f"{units}"
        )

    def _run_estimate(self, method: Method, steps: int) -> float:
        """Seconds one run should take: its steps at the calibrated price, plus its evaluations."""
        kind = method.own_kinds()[0] if method.own_kinds() else STEP
        step = self.calibration.seconds(kind if kind in self.calibration.step_seconds else STEP)
        batches = -(-len(self.task.evaluation) // self.task.eval_batch_size)
        per_eval = (
            self.calibration.forward_seconds * batches * self.task.eval_batch_size / self.task.batch_size
        )
        return steps * step + (self.protocol.eval_points + 1) * per_eval

    def _estimate_seconds(self) -> float:
        """Seconds of the first seed's runs (the other seeds run only for near-winners)."""
        steps = self.task.max_steps
        total = sum(self._run_estimate(parse_method("plain"), steps) for _ in self.protocol.lr_multipliers)
        total += sum(self._run_estimate(parse_method("plain"), round(steps * b)) for b in BUDGETS[:-1])
        for method in self.methods:
            runs = len(self.protocol.method_lr_multipliers) * (2 if method.spec in self.nulls else 1)
            total += runs * self._run_estimate(method, steps)
        return total

    def _announce(self) -> None:
        first = self._estimate_seconds()
        plain_runs = len(self.protocol.lr_multipliers) + len(BUDGETS) - 1
        method_runs = sum(
            len(self.protocol.method_lr_multipliers) * (2 if m.spec in self.nulls else 1)
            for m in self.methods
        )
        done = len(self.record.runs)
        self.echo(
            f"plan: {plain_runs} plain runs (sweep x{list(self.protocol.lr_multipliers)}, widened up to "
            f"{self.protocol.widen} times; frontier 1/4, 1/2, 3/4) and {method_runs} method runs on seed "
            f"{self.protocol.seeds[0]}, {self.task.max_steps} steps each at most; "
            + (
                f"seeds {list(self.protocol.seeds[1:])} only for methods within {1 - NEAR_WIN:.0%} of "
                "winning. "
                if self.protocol.seeds[1:]
                else "one seed (add --seeds 0 1 2 for a verdict that can say `wins`). "
            )
            + f"Estimated {_duration(first)} for the first seed"
            + (f" ({done} runs already in the record are skipped)." if done else ".")
        )

    def _judge(self) -> None:
        specs = [m.spec for m in self.methods] + [n.spec for n in self.nulls.values()]
        parents = {null.spec: parent for parent, null in self.nulls.items()}
        plain, rows = verdicts(self.record.runs, specs, self.protocol.seeds, parents)
        self.record.data["plain"] = plain
        self.record.data["verdicts"] = rows
        self.record.save()


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"~{seconds:.0f} s"
    if seconds < 5400:
        return f"~{seconds / 60:.0f} min"
    return f"~{seconds / 3600:.1f} h"


def results_dir(out: str | None, name: str) -> Path:
    return Path(out or f"bench_results/{name}")
