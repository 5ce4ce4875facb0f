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
