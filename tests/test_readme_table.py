"""The README's verdict table is what the arena's records say (benchmarks/table.py wrote it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _table_module():
    spec = importlib.util.spec_from_file_location("arena_table", ROOT / "benchmarks" / "table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_generated_from_the_records():
    table = _table_module()
    records = table.load()
    assert records, "no arena record under benchmarks/results/arena"
    generated = table.table(records)
    readme = (ROOT / "README.md").read_text()
    block = readme.partition(table.START)[2].partition(table.END)[0].strip("\n")
    assert block == generated, "README.md's table is stale: run `python benchmarks/table.py`"
    for task, record in records.items():
        assert f"`{task}`: `{record['command']}`" in block  # every claim names its command


def test_a_record_without_verdicts_is_listed_as_being_run_not_as_a_column():
    table = _table_module()
    records = table.load()
    judged = next(iter(records.values()))
    running = {"command": "hf-hybrid bench --tasks minilm_lora --out x", "runs": [{}, {}, {}], "verdicts": []}
    generated = table.table({"clm_stdlib": judged, "minilm_lora": running})
    header = next(line for line in generated.splitlines() if line.startswith("| method |"))
    assert "`minilm_lora`" not in header
    assert "- `minilm_lora`: `hf-hybrid bench --tasks minilm_lora --out x` (3 runs so far)" in generated
    assert "`minilm_cls`, `decoder_ft`, `decoder_lora`" in generated  # the ones with no record at all


def test_a_method_that_wins_on_one_task_is_named_with_its_task():
    table = _table_module()

    def verdict(method, verdict, units, seeds=(0, 1, 2)):
        per_seed = [
            {
                "speedup_units": units,
                "speedup_units_kind": "interpolated",
                "speedup_time_kind": "interpolated",
            }
        ] * len(seeds)
        return {
            "method": method,
            "verdict": verdict,
            "speedup_units": units,
            "speedup_time": units,
            "final_loss_delta": -0.01,
            "seeds": list(seeds),
            "per_seed": per_seed,
        }

    records = {
        "clm_stdlib": {
            "verdicts": [verdict("plain", "baseline", 1.0), verdict("freeze:1", "loses", 0.3, (0,))]
        },
        "minilm_cls": {"verdicts": [verdict("plain", "baseline", 1.0), verdict("freeze:4", "wins", 1.8)]},
    }
    line = table.wins_somewhere(records)
    assert "on `minilm_cls` `freeze:4` 1.80x / 1.80x (eval loss -0.010 vs plain, 3 seeds)" in line
    assert "clm_stdlib" not in line
    assert table.wins_everywhere(records) == []
    no_wins = {"clm_stdlib": records["clm_stdlib"]}
    assert table.wins_somewhere(no_wins) == "No method wins on any single task either."
