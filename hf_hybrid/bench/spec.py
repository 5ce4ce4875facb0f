"""The arena's unit of work: one `RunSpec` in, one `RunRow` (`rows.py`) out.

A spec says everything a run needs besides the task: the method, seed and learning rate, the
`TrainingArguments` of its schedule, where it starts (0, or a trunk checkpoint at `start`) and where it
stops, and what to measure at the end. The protocol (`plan.py`) hands out every spec whose inputs are
known; whoever executes it (this process, a local worker, a Ray task) returns the same row.

Kinds:
- `segment`: a stretch of a trunk, from its checkpoint at `start` (or from scratch) to `stop`, where it
  saves the next checkpoint (the last segment ends the full budget and is evaluated);
- `branch`: from the trunk checkpoint at `start` (a fork) through the cooldown to the end of its budget;
- `separate`: a complete run of one budget with its own schedule (methods that cannot branch, the schedule
  check, the other seeds of a method);
- `range_test`: a learning-rate range test (`range_test.py`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

SEGMENT, BRANCH, SEPARATE, RANGE_TEST = "segment", "branch", "separate", "range_test"
KINDS = (SEGMENT, BRANCH, SEPARATE, RANGE_TEST)


@dataclass(frozen=True)
class RunSpec:
    method: str
    seed: int
    lr_multiplier: float
    learning_rate: float
    kind: str
    budget: float  # the budget this run serves (a segment: the budget whose fork it ends at)
    start: int  # 0, or the trunk checkpoint's step it resumes from
    stop: int  # the optimizer step where it ends
    schedule_json: str  # TrainingArguments fields of its schedule (max_steps, lr_scheduler_type, ...)
    trunk_dir: str | None = None  # the trunk's checkpoint folder (segments and branches)
    evaluate: bool = True
    per_example: bool = False  # keep the per-example eval losses (plain full-budget points)
    replays: str | None = None  # a null control: the key of the row whose phases it replays
    replay: tuple[str, ...] | None = None
    repeat: int = 0  # the same run again (n > 0), timed beside the first: the clock noise of identical work

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"`kind` must be one of {list(KINDS)}, got {self.kind!r}")

    @property
    def schedule(self) -> dict[str, Any]:
        return json.loads(self.schedule_json)

    @property
    def steps(self) -> int:
        """The schedule's length (`max_steps`): a segment's is the full budget, a branch's its own."""
        return int(self.schedule["max_steps"])

    @property
    def key(self) -> str:
        """What makes two runs the same run: the record skips a spec whose key it holds."""
        shape = self.schedule.get("lr_scheduler_type", "")
        key = (
            f"{self.method} | lr {self.learning_rate:.6g} | seed {self.seed} | {self.kind} {shape} "
            f"{self.start}-{self.stop} of {self.steps}"
        )
        key += f" | repeat {self.repeat}" if self.repeat else ""
        return key if self.replays is None else f"{key} | replays [{self.replays}]"

    @property
    def checkpoint(self) -> str | None:
        """The checkpoint this run resumes from (None: from scratch)."""
        if self.start == 0:
            return None
        return f"{self.trunk_dir}/checkpoint-{self.start}"

    @property
    def saves(self) -> bool:
        """A segment that ends before its schedule does leaves a checkpoint for what follows."""
        return self.kind == SEGMENT and self.stop < self.steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        data = dict(data)
        if data.get("replay") is not None:
            data["replay"] = tuple(data["replay"])
        return cls(**data)


def schedule_json(fields: dict[str, Any]) -> str:
    return json.dumps(fields, sort_keys=True)
