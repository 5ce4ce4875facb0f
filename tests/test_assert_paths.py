"""Every test of the suite asserts on every path (tests/assert_paths.py), and the checker tells the
vacuous shapes from the real ones."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from assert_paths import findings, suite_files


def test_every_test_of_the_suite_asserts_on_every_path():
    everything = suite_files()
    tests = [p for p in everything if p.name.startswith("test_")]
    assert len(tests) > 30 and Path(__file__) in tests
    found = findings(tests, everything)
    assert not found, "\n".join(map(str, found))


def _flagged(tmp_path: Path, source: str) -> set[str]:
    path = tmp_path / "test_sample.py"
    path.write_text(textwrap.dedent(source))
    return {f.name for f in findings([path])}


VACUOUS = {
    "under_an_if": """
        def test_x(rows):
            for prev, cur in zip(rows, rows[1:]):
                if cur:
                    assert prev
        """,
    "in_a_loop_that_may_not_run": """
        def test_x(records):
            for r in records:
                assert r.ok
        """,
    "after_an_early_return": """
        def test_x(message):
            if message is None:
                make()
                return
            with pytest.raises(ValueError, match=message):
                make()
        """,
    "in_a_callback": """
        def test_x(trainer):
            trainer.add_callback(lambda t: check(t))
            def check(t):
                assert t.ok
            trainer.train()
        """,
    "swallowed_by_a_handler": """
        def test_x():
            try:
                assert run()
            except AssertionError:
                pass
        """,
    "a_helper_that_asserts_only_sometimes": """
        def _check(rows):
            for row in rows:
                assert row
        def test_x(rows):
            _check(rows)
        """,
    "nothing": """
        def test_x(trainer):
            trainer.train()
        """,
}


@pytest.mark.parametrize("source", VACUOUS.values(), ids=VACUOUS.keys())
def test_vacuous_tests_are_flagged(tmp_path, source):
    assert _flagged(tmp_path, source) == {"test_x"}


REAL = {
    "assert": """
        def test_x():
            assert run()
        """,
    "raises": """
        def test_x():
            with pytest.raises(ValueError):
                run()
        """,
    "both_branches": """
        def test_x(flag):
            if flag:
                assert run()
            else:
                assert not run()
        """,
    "a_loop_after_a_non_empty_check": """
        def test_x(records):
            assert records
            for r in records:
                assert r.ok
        """,
    "a_loop_over_a_literal": """
        def test_x():
            for k in (1, 2, 3):
                assert run(k)
        """,
    "a_helper_that_always_asserts": """
        def _check(rows):
            assert rows
            for row in rows:
                assert row
        def _check_twice(rows):
            _check(rows)
        class TestX:
            def test_x(self, rows):
                _check_twice(rows)
        """,
    "assert_close": """
        def test_x():
            torch.testing.assert_close(run(), 1.0)
        """,
}


@pytest.mark.parametrize("source", REAL.values(), ids=REAL.keys())
def test_real_tests_pass(tmp_path, source):
    assert _flagged(tmp_path, source) == set()
