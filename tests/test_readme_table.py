"""The README's verdict table is what the arena's records say (benchmarks/table.py wrote it): the current
judge's records (schema 3), naming each verdict that changed from the previous judge's (schema 2)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _table_module():
    spec = importlib.util.spec_from_file_location("arena_table", ROOT / "benchmarks" / "table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """A record of the current judge, written by the arena on runs that train nothing (fake_arena.py)."""
    sys.path.insert(0, str(ROOT / "tests" / "bench"))
    try:
        from fake_arena import plain_loss, run
    finally:
        sys.path.remove(str(ROOT / "tests" / "bench"))

    def loss(m, r, b, s):
        return plain_loss(r, b, s) + {"freeze:2": -0.15, "dropbp:p=0.5": 0.4}.get(m, 0.0)

    data, _ = run(tmp_path_factory.mktemp("record"), ["plain", "freeze:2", "dropbp:p=0.5"], loss)
    return data


def test_the_readme_table_is_generated_from_the_records():
    table = _table_module()
    records = table.load()
    assert records, "no arena record under benchmarks/results/arena"
    generated = table.table(records, table.load(table.PREVIOUS))
    readme = (ROOT / "README.md").read_text()
    block = readme.partition(table.START)[2].partition(table.END)[0].strip("\n")
    assert block == generated, "README.md's table is stale: run `python benchmarks/table.py`"
    for task, record in records.items():
        if record["verdicts"]:
            assert f"`{task}`: `{record['command']}`" in block  # every claim names its command


def test_a_verdict_that_changed_from_the_previous_judge_s_is_named(judged):
    table = _table_module()
    before = [{**v, "verdict": "ties"} if v["method"] == "freeze:2" else v for v in judged["verdicts"]]
    generated = table.table({"clm_stdlib": judged}, {"clm_stdlib": {**judged, "verdicts": before}})
    assert "- `clm_stdlib`: `freeze:2` ties → wins (1 of 2 unchanged)" in generated
    same = table.table({"clm_stdlib": judged}, {"clm_stdlib": judged})
    assert "- `clm_stdlib`: no verdict changed (2 of 2 unchanged)" in same


def test_a_record_without_verdicts_is_listed_as_being_run_not_as_a_column(judged):
    table = _table_module()
    running = {
        "schema_version": 3,
        "command": "hf-hybrid bench --tasks minilm_lora --out x",
        "runs": [{}, {}, {}],
        "verdicts": [],
    }
    generated = table.table({"clm_stdlib": judged, "minilm_lora": running})
    header = next(line for line in generated.splitlines() if line.startswith("| method |"))
    assert "`minilm_lora`" not in header and "`clm_stdlib`" in header
    assert "- `minilm_lora`: `hf-hybrid bench --tasks minilm_lora --out x` (3 runs so far)" in generated
    # the ones with no record at all
    assert "`minilm_cls`, `decoder_ft`, `decoder_lora`, `instruct_docstrings`" in generated


def test_each_cell_says_its_band_and_each_task_its_resolution_and_cost(judged):
    table = _table_module()
    generated = table.table({"clm_stdlib": judged})
    freeze = table.pick(judged, "freeze")
    low, high = freeze["band"]["low"], freeze["band"]["high"]
    assert f"`freeze:2`: >1.50x / 1.00x (-0.150; band {low:.2f}–{high:.2f}x), **wins** |" in generated
    assert "at 0.5 of the budget" in table.cell(table.pick(judged, "dropbp"))  # stopped early, and says so
    resolution = judged["plain"]["resolution"]
    documents = len(set(judged["eval_clusters"]))
    res = resolution["resolution"]
    line = f"- `clm_stdlib`: resolution {res:.2f}x at 3 seed(s), {documents} eval documents;"
    assert line in generated
    assert f"plain's part {judged['plain']['cost_plain_runs']['total']:.1f}" in generated
    assert "| `packing` |" not in generated  # a family no record holds is not a row
    advice = generated.partition("What to do next on `clm_stdlib`")[2]
    assert "`freeze:2` wins" in advice and "```python" in advice  # the winner's code to paste


def test_a_method_that_wins_on_one_task_is_named_with_its_task():
    table = _table_module()

    def verdict(method, verdict, units, seeds=(0, 1, 2)):
        return {
            "method": method,
            "verdict": verdict,
            "speedup_units": units,
            "speedup_units_kind": "interpolated",
            "speedup_time": units,
            "loss_delta": -0.01,
            "band": {"low": 0.8, "high": 1.25},
            "seeds": list(seeds),
        }

    records = {
        "clm_stdlib": {
            "verdicts": [verdict("plain", "baseline", 1.0), verdict("freeze:1", "loses", 0.3, (0,))]
        },
        "minilm_cls": {"verdicts": [verdict("plain", "baseline", 1.0), verdict("freeze:4", "wins", 1.8)]},
    }
    line = table.wins_somewhere(records)
    assert (
        "on `minilm_cls` `freeze:4` 1.80x / 1.80x (eval loss -0.010 vs plain, band 0.80–1.25x, 3 seeds)"
        in line
    )
    assert "clm_stdlib" not in line and "None wins on every task" in line
    assert table.wins_everywhere(records) == []
    no_wins = {"clm_stdlib": records["clm_stdlib"]}
    assert table.wins_somewhere(no_wins) == "No method wins on any single task either."
