"""The suite's skip gate (tests/skip_gate.py) fails a run that skips a test tests/allowed_skips.txt does not
list, and lets a listed one pass: run on a few planted tests in a fresh pytest process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from skip_gate import ALLOWED_SKIPS, read_allowed_skips

PLANTED = """
import pytest


def test_listed():
    pytest.skip("planted: allowed")


def test_unlisted():
    pytest.skip("planted: not allowed")


@pytest.mark.parametrize("x", [1, 2])
def test_listed_with_params(x):
    pytest.skip("planted: allowed, every parameter")


def test_runs():
    assert True
"""


def _run(tmp_path: Path, allowed: str, files: dict[str, str]) -> subprocess.CompletedProcess:
    for name in ("conftest.py", "skip_gate.py"):
        shutil.copy(Path(__file__).with_name(name), tmp_path / name)
    (tmp_path / "allowed_skips.txt").write_text(allowed)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's options
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


ALLOWED = (
    "# comment\ntest_planted.py::test_listed | planted\ntest_planted.py::test_listed_with_params | planted\n"
)


def test_an_unlisted_skip_fails_the_run_and_is_named(tmp_path):
    module_skip = (
        'import pytest\n\npytest.importorskip("no_such_package_hf_hybrid")\n\n\ndef test_x():\n    pass\n'
    )
    proc = _run(tmp_path, ALLOWED, {"test_planted.py": PLANTED, "test_module_skip.py": module_skip})
    out = proc.stdout
    assert proc.returncode == 1, out
    assert "skipped, and not on allowed_skips.txt" in out
    assert "test_planted.py::test_unlisted: Skipped: planted: not allowed" in out
    assert "test_module_skip.py: Skipped: could not import 'no_such_package_hf_hybrid'" in out
    assert "test_planted.py::test_listed:" not in out and "test_listed_with_params" not in out
    assert "1 passed, 5 skipped" in out


def test_listed_skips_pass(tmp_path):
    planted = PLANTED.replace('pytest.skip("planted: not allowed")', "pass")
    proc = _run(tmp_path, ALLOWED, {"test_planted.py": planted})
    assert proc.returncode == 0, proc.stdout
    assert "2 passed, 3 skipped" in proc.stdout and "not on allowed_skips.txt" not in proc.stdout


def test_an_entry_without_a_reason_is_refused(tmp_path):
    proc = _run(tmp_path, "test_planted.py::test_listed\n", {"test_planted.py": PLANTED})
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "allowed_skips.txt:1: expected `test id | why`" in proc.stdout + proc.stderr


def test_every_listed_test_exists_and_says_why():
    """A stale entry would allow a skip nobody reads: each names a test that is in the suite."""
    root = ALLOWED_SKIPS.parents[1]
    allowed = read_allowed_skips()
    assert allowed  # the GPU tests, at least
    for test_id, reason in allowed.items():
        path, _, name = test_id.partition("::")
        assert (root / path).is_file() and f"def {name}(" in (root / path).read_text(), test_id
        assert len(reason.split()) >= 5, test_id
