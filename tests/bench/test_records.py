"""Every committed arena record says what its own runs say: its decisions and verdicts, recomputed from
its rows alone, are the ones it holds."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from hf_hybrid.bench.arena import parse_methods
from hf_hybrid.bench.budget import Budgets
from hf_hybrid.bench.plan import Planner, Protocol
from hf_hybrid.bench.rows import Rows, RunRow
from hf_hybrid.bench.verdicts import verdicts

RECORDS = sorted(
    (Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "arena").glob("*/results.json")
)


def _methods(command: str) -> list[str]:
    words = shlex.split(command)
    start = words.index("--methods") + 1
    end = next((i for i in range(start, len(words)) if words[i].startswith("--")), len(words))
    return words[start:end]


def _seeds(command: str) -> tuple[int, ...]:
    words = shlex.split(command)
    if "--seeds" not in words:
        return (0,)
    start = words.index("--seeds") + 1
    end = next((i for i in range(start, len(words)) if words[i].startswith("--")), len(words))
    return tuple(int(w) for w in words[start:end])


def recomputed(data: dict, out: Path) -> tuple[dict, list[dict], dict]:
    protocol_data = data["protocol"]
    protocol = Protocol(
        seeds=_seeds(data["command"]),
        lr_multipliers=tuple(protocol_data["lr_multipliers"]),
        widen=protocol_data["widen"],
        cooldown=protocol_data["cooldown_fraction"],
        decay=protocol_data["decay_shape"],
        schedule=protocol_data["schedule"],
    )
    budgets = Budgets(
        data["task"]["max_steps"], protocol.cooldown, protocol.decay, protocol_data["warmup_steps"]
    )
    methods, with_nulls = parse_methods(_methods(data["command"]))
    from hf_hybrid.bench.methods import parse_method

    nulls = {m.spec: parse_method(m.null_spec()) for m in methods if with_nulls and m.null_spec()}
    schedule = {
        "lr_scheduler_type": data["task"]["lr_scheduler_type"],
        "lr_scheduler_kwargs": {},
        "warmup_steps": protocol_data["warmup_steps"],
    }
    rows = Rows(RunRow.from_dict(r) for r in data["runs"])
    planner = Planner(
        protocol, budgets, rows, methods, nulls, data["decisions"]["base_learning_rate"], schedule, out
    )
    plan = planner.plan()
    plain, rows_out = verdicts(planner, {n.spec: p for p, n in nulls.items()})
    return plain, rows_out, plan.decisions.to_dict()


@pytest.mark.parametrize("path", RECORDS, ids=[p.parent.name for p in RECORDS])
def test_a_committed_record_recomputes_to_its_own_verdicts(path, tmp_path):
    data = json.loads(path.read_text())
    assert data["schema_version"] == 2, f"{path} is a record of the first protocol"
    plain, rows, decisions = recomputed(data, tmp_path)
    if data["verdicts"]:  # a record still being run holds no verdicts yet, and resumes from its rows
        assert json.loads(json.dumps(decisions)) == data["decisions"]
        assert json.loads(json.dumps(rows)) == data["verdicts"]
        assert json.loads(json.dumps(plain)) == data["plain"]
