"""The coordinator: asks the protocol (`plan.py`) for the runs it needs, hands them to an executor, and
writes each finished run into the record, alone and at once.

A killed coordinator loses only the runs in flight: the same command plans again from the record, runs
them again, and counts nothing twice (a row is keyed by its spec). A run that raises or whose process
dies is tried once more; after a second failure it is recorded with its error and the protocol goes on
(a failed point counts as diverged). A trunk checkpoint is deleted once the segment and branch that
start from it are recorded; a checkpoint that a run needs and that is gone is made again by running its
recorded segment again, which must reproduce the recorded losses (a note says so when it does not).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data import DataError
from .budget import Budgets
from .calibration import Calibration, calibrate
from .eta import Eta, usual_cost
from .executors import Finished, InProcess, describe
from .methods import NULL, STEP, Method, parse_method
from .plan import Plan, Planner
from .protocol import Protocol, rules
from .reading import MIXED
from .record import Record
from .rows import Rows, RunRow, is_point
from .spec import RunSpec
from .task import BenchTask
from .verdicts import verdicts

logger = logging.getLogger(__name__)

ATTEMPTS = 2


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


@dataclass
class InFlight:
    spec: RunSpec
    worker: str
    began: float
    rebuild: bool = False


@dataclass
class Progress:
    """Runs done, in flight and ready, and the wall time left (`eta.py`)."""

    echo: Callable[[str], None]
    eta: Eta
    done: int = 0
    planned_runs: int = 0  # ready or in flight: a floor of what is left
    planned_steps: int = 0

    def line(self, finished: Finished, row: RunRow | None, flight: dict[str, InFlight], ready: int) -> str:
        spec = finished.spec
        what = (
            f"[{finished.worker}] {spec.method[:36]:<36} x{spec.lr_multiplier:<5g} seed {spec.seed} "
            f"{spec.kind} {spec.start}-{spec.stop}"
        )
        wall = f"{self.eta.finished[-1][1]:.0f} s wall" if self.eta.finished else ""
        if row is None:
            result = f"failed: {finished.error}"
        else:
            clock = "CPU" if row.clock == "cpu_time" else "wall, synchronized"
            spent = f"{row.own_seconds:6.1f} s {clock} training, {wall} in all"
            loss = "" if row.eval_loss is None else f"eval loss {row.eval_loss:.4f}  {row.units:8.0f} units  "
            result = loss + spent
        running = ", ".join(
            f"{f.worker}: {f.spec.method[:16]} {f.spec.kind} {f.spec.start}-{f.spec.stop} "
            f"({time.perf_counter() - f.began:.0f} s wall)"
            for f in flight.values()
        )
        left = self.eta.text(self.planned_runs, self.planned_steps)
        return f"{what}  {result}\n    done {self.done}, in flight {len(flight)}, ready {ready}; {left}" + (
            f" | {running}" if running else ""
        )


class Arena:
    """Runs the protocol for one task into one record, with one executor."""

    def __init__(
        self,
        task: BenchTask,
        methods: Sequence[Method],
        with_nulls: bool,
        protocol: Protocol,
        record: Record,
        executor: Any = None,
        echo: Callable[[str], None] = print,
    ) -> None:
        self.task, self.protocol, self.record, self.echo = task, protocol, record, echo
        self.methods = list(methods)
        self.nulls = {m.spec: parse_method(m.null_spec()) for m in methods if with_nulls and m.null_spec()}
        self.parents = {null.spec: parent for parent, null in self.nulls.items()}
        warmup = round(task.warmup_ratio * task.max_steps)
        self.budgets = Budgets(task.max_steps, protocol.cooldown, protocol.decay, warmup)
        self.executor = executor or InProcess(task)
        self.calibration: Calibration | None = None
        # this process's runs: a time ratio compares only runs of one invocation (a machine's load moves
        # between invocations: 3.6x between a quiet and a loaded hour)
        self.invocation = f"{time.strftime('%Y-%m-%dT%H:%M:%S')}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.out = record.path.parent
        self.rebuilds: dict[str, int] = {}

    def check(self) -> None:
        """Everything that can be refused before a step is trained."""
        self.budgets.check()
        if not self.protocol.seeds or len(set(self.protocol.seeds)) != len(self.protocol.seeds):
            raise DataError(
                f"`--seeds` must be distinct seeds, at least one, got {list(self.protocol.seeds)}"
            )
        values = self.protocol.lr_multipliers
        if not values or any(not v > 0 for v in values):
            raise DataError(f"`--lr_multipliers` must be positive numbers, at least one, got {list(values)}")
        if self.protocol.widen < 0:
            raise DataError(f"`--widen` must be >= 0, got {self.protocol.widen}")
        self._decline()
        model = self.task.build_model(self.protocol.seeds[0])
        for method in [*self.methods, *self.nulls.values()]:
            method.check_model(model)

    def _decline(self) -> None:
        """Leave out the methods that have nothing to do on this task, the record saying why."""
        for method in list(self.methods):
            reason = method.declines(self.task)
            if reason is not None:
                self.record.note(f"`{method.spec}` was not run: {reason}")
                self.echo(f"{method.spec}: not run: {reason}")
                self.methods.remove(method)
                self.nulls.pop(method.spec, None)

    # ---- the loop --------------------------------------------------------------------------------------

    def run(self) -> None:
        """The protocol to its end (`check` first: it refuses what cannot run)."""
        self._calibrate()
        self.record.data["protocol"] = {
            **self.budgets.describe(),
            "lr_multipliers": list(self.protocol.lr_multipliers),
            "widen": self.protocol.widen,
            "seeds": list(self.protocol.seeds),
            "schedule": self.protocol.schedule,
            "rules": dict(rules()),
        }
        if self.task.eval_clusters is not None:
            self.record.data["eval_clusters"] = list(self.task.eval_clusters)
        runs, budgets = usual_cost(len(self.protocol.seeds), len(self.methods) + len(self.nulls))
        eta = Eta(
            self.executor.workers,
            self.task.max_steps,
            runs,
            budgets * self.task.max_steps,
            self.calibration.step_seconds.get(STEP, 0.0),
        )
        progress = Progress(self.echo, eta)
        flight: dict[str, InFlight] = {}
        failures: dict[str, int] = {}
        self.echo(f"running on {describe(self.executor)}")
        first = True
        try:
            while True:
                plan = self._plan()
                self._clean_checkpoints(plan)
                if self._reuse(plan) or self._doom(plan):
                    continue
                self._submit(plan, flight)
                waiting = [
                    *plan.specs,
                    *(f.spec for f in flight.values() if f.spec.key not in plan_keys(plan)),
                ]
                progress.planned_runs = len(waiting)
                progress.planned_steps = sum(s.stop - s.start for s in waiting)
                if first:
                    self.echo(f"the whole arena: {eta.text(progress.planned_runs, progress.planned_steps)}")
                    first = False
                if not flight:
                    if plan.complete:
                        break
                    raise RuntimeError("the arena's plan is stuck: no run is ready and none is in flight")
                for finished in self.executor.wait():
                    self._finish(finished, flight, failures, progress, len(plan.specs))
        finally:
            self.executor.close()
        self._judge()
        shutil.rmtree(self.out / "checkpoints", ignore_errors=True)

    def _planner(self, rows: Rows | None = None) -> Planner:
        return Planner(
            self.protocol,
            self.budgets,
            rows if rows is not None else self.record.rows(),
            self.methods,
            self.nulls,
            self.record.data.get("decisions", {}).get("base_learning_rate") or self.task.learning_rate,
            {
                "lr_scheduler_type": self.task.lr_scheduler_type,
                "lr_scheduler_kwargs": {},
                "warmup_steps": self.budgets.warmup_steps,
            },
            self.out,
            eval_clusters=self.record.data.get("eval_clusters"),
            eval_weights=self.record.data.get("eval_example_tokens"),
            price_errors=(self.record.data.get("calibration") or {}).get("relative_errors"),
            price_df=price_df(self.record.data.get("calibration") or {}),
        )

    def _plan(self) -> Plan:
        plan = self._planner().plan()
        self.record.data["decisions"] = plan.decisions.to_dict()
        return plan

    def _reuse(self, plan: Plan) -> bool:
        """Record the runs that provably train like a recorded one (a null of a run that predicted
        nothing: the plain run), without training them."""
        rows = self.record.rows()
        for spec, twin_key in plan.reuse:
            twin = rows.get(twin_key)
            row = RunRow.from_dict({**twin.to_dict(), **_identity(spec), "reused_from": twin_key})
            self.record.add(row)
        return bool(plan.reuse)

    def _doom(self, plan: Plan) -> bool:
        """Record as failed, without training, the runs whose trunk failed before them."""
        for spec, why in plan.doomed:
            self.record.add(self._failed_row(spec, why))
        return bool(plan.doomed)

    def _submit(self, plan: Plan, flight: dict[str, InFlight]) -> None:
        capacity = self.executor.workers - len(flight)
        rebuilding = {s.key for s in plan.rebuild}
        for spec in [*plan.rebuild, *plan.specs]:
            if capacity <= 0:
                return
            if spec.key in flight:
                continue
            if spec.key not in rebuilding and spec.checkpoint and not Path(spec.checkpoint).is_dir():
                continue  # waits for its checkpoint to be rebuilt
            worker = self.executor.submit(spec)
            flight[spec.key] = InFlight(spec, worker, time.perf_counter(), spec.key in rebuilding)
            capacity -= 1

    def _finish(
        self,
        finished: Finished,
        flight: dict[str, InFlight],
        failures: dict[str, int],
        progress: Progress,
        ready: int,
    ) -> None:
        spec = finished.spec
        entry = flight.pop(spec.key)
        row = None
        if entry.rebuild:
            self.rebuilds[spec.key] = self.rebuilds.get(spec.key, 0) + 1
            if self.rebuilds[spec.key] > ATTEMPTS:
                raise RuntimeError(
                    f"the checkpoint of `{spec.key}` was rebuilt {ATTEMPTS} times and is gone again"
                )
            self._check_rebuild(finished)
        elif finished.measured is None:
            failures[spec.key] = failures.get(spec.key, 0) + 1
            if failures[spec.key] < ATTEMPTS:
                self.echo(f"  {spec.key}: failed ({finished.error}); trying once more")
                return
            row = self._failed_row(spec, finished.error)
            self.record.add(row)
            self.record.note(f"`{spec.key}` failed twice: {finished.error}")
        else:
            row = self._row(spec, finished)
            self.record.add(row)
        progress.eta.add(spec.stop - spec.start, time.perf_counter() - entry.began)
        progress.done += 1
        self.echo(progress.line(finished, row, flight, ready))

    def _row(self, spec: RunSpec, finished: Finished) -> RunRow:
        measured = finished.measured.to_dict()
        del measured["stop"]  # the spec's
        tokens = measured.pop("eval_example_tokens")
        if tokens and "eval_example_tokens" not in self.record.data:
            self.record.data["eval_example_tokens"] = tokens
        before = self._segment_before(spec)
        seconds = (before.seconds if before is not None else 0.0) + measured["own_seconds"]
        units = self.calibration.cost(measured["step_counts"])
        invocation = self.invocation
        if before is not None and before.invocation != invocation:
            invocation = MIXED  # its seconds add up runs timed on differently loaded machines
        identity = {**_identity(spec), "invocation": invocation}
        return RunRow(**identity, **measured, units=units, seconds=seconds, attempts=1)

    def _segment_before(self, spec: RunSpec) -> RunRow | None:
        """The recorded trunk segment that `spec` continues (its seconds up to the start; the units travel
        in the step counts)."""
        if spec.start == 0:
            return None
        return self.record.rows().get(self._planner().segment_before(spec).key)

    def _failed_row(self, spec: RunSpec, error: str | None) -> RunRow:
        return RunRow(
            **_identity(spec),
            eval_loss=None,
            units=0.0,
            seconds=0.0,
            own_seconds=0.0,
            wall_seconds=0.0,
            clock="",
            error=error,
            attempts=ATTEMPTS,
        )

    def _check_rebuild(self, finished: Finished) -> None:
        recorded = self.record.rows().get(finished.spec.key)
        if finished.measured is None:
            self.record.note(f"rebuilding the checkpoint of `{finished.spec.key}` failed: {finished.error}")
        elif finished.measured.losses != recorded.losses:
            self.record.note(
                f"`{finished.spec.key}` run again for its checkpoint did not reproduce its recorded losses: "
                "the runs after it continue from the new one"
            )

    def _clean_checkpoints(self, plan: Plan) -> None:
        """Delete a trunk checkpoint once both the segment and the branch starting from it are recorded,
        unless a planned run resumes from it (a rebuild that restores a later checkpoint of its trunk)."""
        root = self.out / "checkpoints"
        if not root.is_dir():
            return
        wanted = {Path(s.checkpoint) for s in [*plan.rebuild, *plan.specs] if s.checkpoint}
        starts = Counter(
            (row.spec["trunk_dir"], row.start)
            for row in self.record.rows()
            if row.spec.get("trunk_dir") and row.start > 0 and not row.failed and row.reused_from is None
        )
        for (trunk, step), count in starts.items():
            folder = Path(trunk) / f"checkpoint-{step}"
            if count >= 2 and folder not in wanted and folder.is_dir():
                shutil.rmtree(folder, ignore_errors=True)

    # ---- calibration, verdicts -------------------------------------------------------------------------

    def _calibrate(self) -> None:
        saved = self.record.data.get("calibration")
        known = Calibration.from_dict(saved) if saved else None
        self.echo("calibrating: timing a forward pass, a plain step and each method's own steps ...")
        failures: dict[str, str] = {}
        self.calibration = calibrate(
            self.task,
            [*self.methods, *self.nulls.values()],
            known=known,
            warm_steps=self.protocol.warm_steps,
            timed_steps=self.protocol.timed_steps,
            failures=failures,
        )
        for spec, error in failures.items():
            self.record.note(f"`{spec}` raised while its steps were timed, so it was not run: {error}")
            self.methods = [m for m in self.methods if m.spec != spec]
            self.nulls = {p: n for p, n in self.nulls.items() if p != spec and n.spec != spec}
        self.record.data["calibration"] = self.calibration.to_dict()
        self.record.save()
        units = ", ".join(f"{k} {v:.2f}" for k, v in self.calibration.to_dict()["units"].items())
        self.echo(
            f"prices in forward units (a forward pass = {self.calibration.forward_seconds * 1e3:.1f} ms): "
            f"{units}"
        )

    def _judge(self) -> None:
        planner = self._planner()
        final = planner.plan()
        plain, rows = verdicts(planner, self.parents)
        self.record.data["decisions"] = final.decisions.to_dict()
        self.record.data["plain"] = plain
        self.record.data["verdicts"] = rows
        self.record.data["unused"] = sorted(r["key"] for r in self.record.runs if r["key"] not in final.used)
        self.record.save()


def _identity(spec: RunSpec) -> dict[str, Any]:
    constant = "constant" in spec.schedule.get("lr_scheduler_type", "")
    return {
        "key": spec.key,
        "method": spec.method,
        "seed": spec.seed,
        "lr_multiplier": spec.lr_multiplier,
        "learning_rate": spec.learning_rate,
        "kind": spec.kind,
        "budget": spec.budget,
        "start": spec.start,
        "stop": spec.stop,
        "steps": spec.steps,
        "point": is_point(spec.kind, spec.stop, spec.steps, constant) and spec.evaluate,
        "replays": spec.replays,
        "spec": spec.to_dict(),
    }


def price_df(calibration: dict[str, Any]) -> float:
    """The degrees of freedom of the calibrated prices: their timed steps less one."""
    timed = calibration.get("timed_steps", 0)
    return timed - 1 if timed > 1 else math.inf


def plan_keys(plan: Plan) -> set[str]:
    return {s.key for s in plan.specs}
