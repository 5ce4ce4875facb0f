"""An arena whose runs train nothing: an executor that answers each spec at once from a loss function of
(method, rate, budget, seed), with per-example eval losses whose noise belongs to (seed, example) and,
for a method that is not an alias of another, to the method too. What the protocol decides from such a
record is what it decides from real runs with those losses."""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hf_hybrid.bench.arena import Arena, parse_methods
from hf_hybrid.bench.execute import Measured
from hf_hybrid.bench.executors import Finished
from hf_hybrid.bench.protocol import Protocol
from hf_hybrid.bench.record import Record
from hf_hybrid.bench.spec import RANGE_TEST
from hf_hybrid.bench.task import BenchTask

STEPS = 200
EXAMPLES, CLUSTER = 60, 3  # 20 documents of 3 examples each
PRICE = {
    "step": 3.0,
    "freeze:2:step": 2.0,
    "dropbp:p=0.5:step": 2.5,
    "args:torch_compile=true:step": 1.5,
    "args:optim=adamw_torch_fused:step": 3.0,
    "selective-backprop:selective": 2.0,  # priced here so that calibration times nothing
    "selective-backprop:rule=uniform:selective": 2.0,
}

Loss = Callable[[str, float, float, int], float]


def plain_loss(rate: float, budget: float, seed: int = 0) -> float:
    """A bowl in log-rate around x2 at every budget, falling with the budget, shifted a little by the
    seed: what a real race looks like."""
    return 3.0 - budget + 0.05 * math.log2(rate / 2.0) ** 2 + 0.003 * seed


def example_noise(key: str, seed: int, scale: float) -> list[float]:
    """Per-example deviations with zero mean, one draw per (key, seed); a document's examples share half
    of theirs (the clustering the bootstrap must see)."""
    draw = random.Random(f"{key}|{seed}")
    shared = [draw.gauss(0, scale) for _ in range(EXAMPLES // CLUSTER)]
    values = [shared[i // CLUSTER] + draw.gauss(0, scale) for i in range(EXAMPLES)]
    mean = sum(values) / len(values)
    return [v - mean for v in values]


class Fake:
    """An executor that answers a spec at once from `loss(method, rate, budget, seed)`."""

    workers = 2

    def __init__(
        self,
        loss: Loss,
        stop_after: int | None = None,
        own_schedule: float = 0.0,
        aliases: Mapping[str, str] | None = None,
        noise: float = 0.05,
        seconds: Callable[[Any], float] | None = None,
    ) -> None:
        self.loss, self.pending, self.stop_after, self.ran = loss, [], stop_after, []
        self.own_schedule = own_schedule  # added to the loss of a run in the task's own (linear) schedule
        self.aliases = dict(aliases or {})  # a method whose runs are another's, to the last digit
        self.noise = noise
        self.seconds = seconds or (lambda spec: float(spec.stop - spec.start))
        self.submitted: list[tuple[str, list[str]]] = []  # each spec and what was in flight beside it

    def submit(self, spec):
        self.submitted.append((spec.key, [p.key for p in self.pending]))
        self.pending.append(spec)
        return "fake"

    def wait(self):
        if self.stop_after is not None and len(self.ran) >= self.stop_after:
            raise KeyboardInterrupt
        spec = self.pending.pop(0)
        self.ran.append(spec.key)
        if spec.saves:  # what the run leaves for its branch and its continuation
            os.makedirs(f"{spec.trunk_dir}/checkpoint-{spec.stop}", exist_ok=True)
        method = self.aliases.get(spec.method, spec.method)
        kind = f"{method}:step" if f"{method}:step" in PRICE else "step"
        loss, examples = None, None
        if spec.evaluate:
            loss = self.loss(method, spec.lr_multiplier, spec.steps / STEPS, spec.seed)
            loss += self.own_schedule if '"linear"' in spec.schedule_json else 0.0
            if spec.per_example:
                noise = example_noise(f"{method}|{spec.lr_multiplier}|{spec.steps}", spec.seed, self.noise)
                examples = [loss + e for e in noise]
        measured = Measured(
            stop=spec.stop,
            eval_loss=loss,
            step_counts={kind: spec.stop},
            own_seconds=self.seconds(spec),
            wall_seconds=self.seconds(spec),
            clock="cpu_time",
            losses=[3.0 if spec.kind == RANGE_TEST else 2.0] * (spec.stop - spec.start),
            eval_example_losses=examples,
            eval_example_tokens=[1] * EXAMPLES if examples else None,
        )
        return [Finished(spec, "fake", measured)]

    def close(self):
        self.pending.clear()


def fake_task(learning_rate: float | None = 1e-3) -> BenchTask:
    """The fake task; with no `learning_rate` the arena's range test sets the races' centre."""
    return BenchTask(
        name="fake",
        task_type="causal_lm",
        build_model=lambda seed: None,
        train=[0] * 100,
        evaluation=[0] * EXAMPLES,
        learning_rate=learning_rate,
        max_steps=STEPS,
        batch_size=4,
        eval_clusters=[i // CLUSTER for i in range(EXAMPLES)],
    )


def run(
    out: Path,
    methods: list[str],
    loss: Loss,
    seeds: tuple[int, ...] = (0, 1, 2),
    executor: Fake | None = None,
    task_rate: float | None = 1e-3,
    **protocol: Any,
) -> tuple[dict[str, Any], Fake]:
    """The arena on the fake task into `out` (resumed when it holds a record), to its end or the
    executor's stop."""
    out.mkdir(parents=True, exist_ok=True)
    task = fake_task(task_rate)
    if not (out / "results.json").exists():  # the prices of a timed calibration, written by hand
        record = Record.open(out, task.describe(), task.identity(), "test")
        record.data["calibration"] = {"forward_seconds": 1.0, "step_seconds": dict(PRICE)}
        record.save()
    record = Record.open(out, task.describe(), task.identity(), "test")
    parsed, nulls = parse_methods(methods)
    executor = executor or Fake(loss)
    settings = {"schedule_check": False, **protocol}
    Arena(
        task, parsed, nulls, Protocol(seeds=seeds, **settings), record, executor=executor, echo=lambda _: None
    ).run()
    return json.loads((out / "results.json").read_text()), executor


def verdict_of(data: dict[str, Any], method: str) -> dict[str, Any]:
    return next(v for v in data["verdicts"] if v["method"] == method)
