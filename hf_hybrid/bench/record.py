"""`results.json`: the arena's record, the one source of truth for a task.

Written after every run (atomically) by the coordinator alone, so the same command again continues
where it stopped, and `report.md` and the plot are generated from it, never edited by hand. Schema
(`SCHEMA_VERSION` 3; version 1 was the first protocol's, with the full budget's rate at every budget,
version 2 the second's, which read each method at its best budget):

- `task`: what was trained (model, data, budget, ...) and `task_identity`, the hash a resumed invocation
  must match; `protocol`: the budgets, their forks and cooldown, the sweep's first rates;
- `calibration`: `forward_seconds` (one unit), `step_seconds` and `units` per kind of step;
- `runs`: one `RunRow` per finished run (`rows.py`): its spec, `kind` (`segment`, `branch`,
  `separate`, `range_test`), `budget`, `eval_loss`, `units` and `seconds` from step 0, `own_seconds`,
  `step_counts`, `losses` (every step's training loss), `details`, `note`, `replays`, `reused_from`,
  `error` (a run that failed twice), `eval_example_losses` (points of 1/4 and of the full budget);
- `eval_clusters` (per eval example: its document) and `eval_example_tokens` (its scored tokens);
- `decisions`: what the protocol decided (`plan.Decisions`): the sweep's rates per budget, the best,
  the untuned budgets, the schedule check, the band, each method's race and chosen rate;
- `plain`: the per-budget best rates, the seed band (and its eval-noise part), the clock noise;
- `verdicts`: one object per method (`verdicts.py`); `unused`: the keys of runs no longer in the plan;
  `notes`: what the coordinator noticed (failures, a rebuilt checkpoint that did not reproduce).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch
import transformers

from ..data import DataError
from .rows import Rows, RunRow

SCHEMA_VERSION = 3
FRESH_FLAG = "--fresh"
RESULTS_FILE = "results.json"


class Record:
    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @classmethod
    def open(
        cls, out: str | os.PathLike, task: dict[str, Any], identity: str, command: str, fresh: bool = False
    ) -> Record:
        """The record in `out` (refused if it belongs to another task or protocol), or a new one; `fresh`
        moves an old protocol's record aside."""
        path = Path(out) / RESULTS_FILE
        if fresh and path.is_file():
            version = json.loads(path.read_text()).get("schema_version")
            if version != SCHEMA_VERSION:
                os.replace(path, path.with_name(f"results.v{version}.json"))
        if path.is_file():
            data = json.loads(path.read_text())
            if data.get("schema_version") != SCHEMA_VERSION:
                raise DataError(
                    f"{path} is a record of the arena's protocol version {data.get('schema_version')!r} "
                    f"(this arena writes version {SCHEMA_VERSION}: equal races, paired seeds, a read at the "
                    f"full budget); rerun with {FRESH_FLAG} to move it aside (results.v"
                    f"{data.get('schema_version')}.json) and start over, or use another --out"
                )
            if data.get("task_identity") != identity:
                differs = sorted(
                    k for k in set(task) | set(data["task"]) if task.get(k) != data["task"].get(k)
                )
                raise DataError(
                    f"{path} belongs to another task (differs in {differs}); use another --out, or remove it "
                    "to start over"
                )
            data["command"] = command
            return cls(path, data)
        data = {
            "schema_version": SCHEMA_VERSION,
            "command": command,
            "machine": machine(),
            "task": task,
            "task_identity": identity,
            "protocol": {},
            "calibration": None,
            "runs": [],
            "decisions": {},
            "plain": {},
            "verdicts": [],
            "unused": [],
            "notes": [],
        }
        return cls(path, data)

    @property
    def runs(self) -> list[dict[str, Any]]:
        return self.data["runs"]

    def rows(self) -> Rows:
        return Rows(RunRow.from_dict(r) for r in self.runs)

    def add(self, row: RunRow) -> None:
        """Append `row`, in place of a row of the same key (a point measured again for what it lacked)."""
        self.data["runs"] = [r for r in self.runs if r["key"] != row.key] + [row.to_dict()]
        self.save()

    def note(self, text: str) -> None:
        if text not in self.data["notes"]:
            self.data["notes"].append(text)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.path)


def machine() -> str:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    cpu = platform.processor() or platform.machine()
    return (
        f"{cpu} ({os.cpu_count()} cores), {device}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {torch.get_num_threads()} torch thread(s)"
    )
