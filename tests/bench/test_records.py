"""Every arena record says what its own runs say: its decisions and verdicts, recomputed from its rows alone
(and the calibration and eval set it holds), are the ones it holds. Checked on a record the arena writes
here (runs that train nothing: fake_arena.py) and on every record of the current judge (schema 3) under
benchmarks/results/arena/ (`<task>/results.json`, or `<task>/<task>/results.json` as `--tasks` writes it):
a record still being run holds no verdicts yet, and must plan from its rows (the same command resumes it);
a task with no record yet is not checked."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from fake_arena import plain_loss, run

from hf_hybrid.bench.arena import parse_methods, price_df
from hf_hybrid.bench.budget import Budgets
from hf_hybrid.bench.methods import parse_method
from hf_hybrid.bench.plan import Planner
from hf_hybrid.bench.protocol import Protocol
from hf_hybrid.bench.record import SCHEMA_VERSION
from hf_hybrid.bench.rows import Rows, RunRow
from hf_hybrid.bench.verdicts import verdicts

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "arena"
RECORDS = sorted({*RESULTS.glob("*/results.json"), *RESULTS.glob("*/*/results.json")})
NOT_RUN = re.compile(r"^`([^`]+)` (?:was not run|raised while its steps were timed)")


def _methods(data: dict) -> list[str]:
    """The methods the record's command listed; a record written by code: the ones its plan decided."""
    words = shlex.split(data["command"])
    if "--methods" not in words:
        nulls = ["null"] if any(v.get("null_control_of") for v in data["verdicts"]) else []
        return [*data["decisions"].get("methods", {}), *nulls]
    start = words.index("--methods") + 1
    end = next((i for i in range(start, len(words)) if words[i].startswith("--")), len(words))
    return words[start:end]


def recomputed(data: dict, out: Path) -> tuple[Planner, dict, list[dict], dict]:
    """The arena's plan and verdicts from the record alone, as the coordinator makes them (`Arena._judge`)."""
    saved = data["protocol"]
    protocol = Protocol(
        seeds=tuple(saved["seeds"]),
        lr_multipliers=tuple(saved["lr_multipliers"]),
        widen=saved["widen"],
        cooldown=saved["cooldown_fraction"],
        decay=saved["decay_shape"],
        schedule=saved["schedule"],
        schedule_check=bool(data["decisions"].get("schedule_check")) or not data["verdicts"],
    )
    budgets = Budgets(data["task"]["max_steps"], protocol.cooldown, protocol.decay, saved["warmup_steps"])
    declined = {m.group(1) for m in map(NOT_RUN.match, data["notes"]) if m}
    methods, with_nulls = parse_methods(list(dict.fromkeys(_methods(data))))
    methods = [m for m in methods if m.spec not in declined]
    nulls = {m.spec: parse_method(m.null_spec()) for m in methods if with_nulls and m.null_spec()}
    schedule = {
        "lr_scheduler_type": data["task"]["lr_scheduler_type"],
        "lr_scheduler_kwargs": {},
        "warmup_steps": saved["warmup_steps"],
    }
    planner = Planner(
        protocol,
        budgets,
        Rows(RunRow.from_dict(r) for r in data["runs"]),
        methods,
        nulls,
        data["decisions"].get("base_learning_rate") or data["task"]["learning_rate"],
        schedule,
        out,
        eval_clusters=data.get("eval_clusters"),
        eval_weights=data.get("eval_example_tokens"),
        price_errors=(data.get("calibration") or {}).get("relative_errors"),
        price_df=price_df(data.get("calibration") or {}),
    )
    plan = planner.plan()
    plain, rows = verdicts(planner, {n.spec: p for p, n in nulls.items()})
    return planner, plain, rows, plan.decisions.to_dict()


def _fake_record(out: Path) -> dict:
    def loss(m, r, b, s):
        return plain_loss(r, b, s) + {"freeze:2": -0.15, "dropbp:p=0.5": 0.4}.get(m, 0.0)

    methods = ["plain", "freeze:2", "dropbp:p=0.5", "selective-backprop", "null"]
    data, _ = run(out, methods, loss, schedule_check=True)
    return data


@pytest.mark.parametrize(
    "path", [None, *RECORDS], ids=["written-here", *(str(p.relative_to(RESULTS)) for p in RECORDS)]
)
def test_a_record_recomputes_to_its_own_decisions_and_verdicts(path, tmp_path):
    data = _fake_record(tmp_path / "record") if path is None else json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION, f"{path} is a record of another protocol"
    assert len({r["key"] for r in data["runs"]}) == len(data["runs"])
    planner, plain, rows, decisions = recomputed(data, tmp_path)
    if not data["verdicts"]:  # still being run: it resumes from its rows (nothing to compare yet)
        return
    assert json.loads(json.dumps(decisions)) == data["decisions"]
    assert json.loads(json.dumps(rows)) == data["verdicts"]
    assert json.loads(json.dumps(plain)) == data["plain"]
    assert sorted(r.key for r in planner.rows if r.key not in planner.used) == data["unused"]
