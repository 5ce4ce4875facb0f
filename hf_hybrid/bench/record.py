"""`results.json`: the arena's record, the one source of truth for a task.

Written after every run (atomically), so the same command again skips what is done, and `report.md`
and the plot are generated from it, never edited by hand. Schema (`SCHEMA_VERSION` 1):

- `task`: what was trained (model, data, budget, ...) and `task_identity`, the hash that a resumed
  invocation must match;
- `calibration`: `forward_seconds` (one unit), `step_seconds` and `units` per kind of step;
- `runs`: one object per finished run — `key`, `method`, `role` (`sweep`, `frontier`, `method`, `null`),
  `learning_rate`, `lr_multiplier` (of the task's base rate), `seed`, `budget` (fraction of `max_steps`),
  `steps`, `eval_loss` (final), `units` (forward units: the step counts priced by the calibration),
  `seconds` (training time, evaluation excluded: CPU time on CPU, wall-clock on CUDA), `wall_seconds`,
  `step_counts`, `curve` (per evaluation: step, seconds, units, eval_loss), `details`, `note`,
  `replays` (a null control: the key of the run whose phases it replayed);
- `plain`: the best learning-rate multiplier, the clock noise and the seed spread;
- `verdicts`: one object per method — `method`, `lr_multiplier`, `seeds`, `speedup_units` and
  `speedup_time` (medians over seeds), their per-seed values, `final_loss_delta` (eval loss − the plain
  run's at the full budget, median), `verdict` (`wins`, `ties`, `loses`; `baseline` for plain) and
  `reason`.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from ..data import DataError

SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"


def run_key(method: str, learning_rate: float, seed: int, steps: int, replays: str | None = None) -> str:
    key = f"{method} | lr {learning_rate:.6g} | seed {seed} | steps {steps}"
    return key if replays is None else f"{key} | replays [{replays}]"


class Record:
    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @classmethod
    def open(cls, out: str | os.PathLike, task: dict[str, Any], identity: str, command: str) -> Record:
        """The record in `out` (refused if it belongs to another task), or a new one."""
        path = Path(out) / RESULTS_FILE
        if path.is_file():
            data = json.loads(path.read_text())
            if data.get("schema_version") != SCHEMA_VERSION:
                raise DataError(
                    f"{path} has schema version {data.get('schema_version')!r}, not {SCHEMA_VERSION}: "
                    "use another --out"
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
            "calibration": None,
            "runs": [],
            "plain": {},
            "verdicts": [],
        }
        return cls(path, data)

    @property
    def runs(self) -> list[dict[str, Any]]:
        return self.data["runs"]

    def find(self, key: str) -> dict[str, Any] | None:
        return next((r for r in self.runs if r["key"] == key), None)

    def add(self, run: dict[str, Any]) -> None:
        self.runs.append(run)
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=_json_default) + "\n")
        os.replace(tmp, self.path)


def _json_default(value: Any) -> Any:
    if isinstance(value, float):
        return value
    return str(value)


def machine() -> str:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    cpu = platform.processor() or platform.machine()
    import transformers

    return (
        f"{cpu} ({os.cpu_count()} cores), {device}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {torch.get_num_threads()} torch thread(s)"
    )
