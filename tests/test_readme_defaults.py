"""The README states every `hybrid_*` default once, in a table generated from the arguments' dataclass
(`scripts/defaults_table.py`); docs/usage.md's settings table agrees with the same dataclass."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import MISSING
from pathlib import Path

from hf_hybrid.hybrid_arguments import hybrid_fields

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| (`hybrid_[^|]*`) \| ([^|]*) \|", re.M)


def _script():
    spec = importlib.util.spec_from_file_location("defaults_table", ROOT / "scripts" / "defaults_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _defaults() -> dict[str, object]:
    return {f.name: f.default_factory() if f.default is MISSING else f.default for f in hybrid_fields()}


def _rows(text: str) -> list[tuple[list[str], list[str]]]:
    """(argument names, default cells) of each row naming `hybrid_*` arguments (`a` / `b` rows split)."""
    return [
        ([n.strip().strip("`") for n in names.split(" / ")], [d.strip() for d in cells.split(" / ")])
        for names, cells in ROW.findall(text)
    ]


def _assert_states_the_defaults(rows: list[tuple[list[str], list[str]]], where: str) -> None:
    defaults = _defaults()
    named = [name for names, _ in rows for name in names]
    assert sorted(named) == sorted(defaults), f"{where}: every hybrid_* argument, each in one row"
    for names, cells in rows:
        for name, cell in zip(names, cells, strict=True):
            if defaults[name] is not None:  # None is said in words ("the training `seed`")
                assert cell.strip("`") == str(defaults[name]), (
                    f"{where}: {name} says {cell}, the code {defaults[name]!r}"
                )


def test_the_readme_table_is_generated_from_the_dataclass():
    script = _script()
    readme = (ROOT / "README.md").read_text()
    block = script.block_of(readme)
    assert block == script.table(), (
        "README.md's hybrid_* table is stale: run python scripts/defaults_table.py"
    )
    _assert_states_the_defaults(_rows(block), "README.md")
    spike_guard = next(f for f in hybrid_fields() if f.name == "hybrid_spike_guard")
    assert f"| `hybrid_spike_guard` | `{spike_guard.default}` |" in block  # the default, not a choice


def test_a_changed_default_makes_the_table_stale(monkeypatch):
    """What the staleness check rests on: the table follows the dataclass's defaults and help."""
    script = _script()
    field = next(f for f in hybrid_fields() if f.name == "hybrid_warmup_steps")
    before = script.table()
    monkeypatch.setattr(field, "default", 7)
    after = script.table()
    assert "| `hybrid_warmup_steps` | 100 |" in before and "| `hybrid_warmup_steps` | 7 |" in after


def test_none_defaults_are_said_in_words():
    script = _script()
    fields = {f.name: f for f in hybrid_fields()}
    assert script.default_text(fields["hybrid_seed"]) == "the training `seed`"
    assert script.default_text(fields["hybrid_predictor_kwargs"]) == "none"


def test_the_usage_page_settings_agree_with_the_dataclass():
    text = (ROOT / "docs" / "usage.md").read_text().partition("## Settings")[2]
    _assert_states_the_defaults(_rows(text), "docs/usage.md")
