"""The suite's skip gate: a run fails when a test skips that `allowed_skips.txt` (beside this file) does
not list with a reason. The test command (README, .ci/run) installs every package the suite needs, so a
skip there is a missing check, not a detail. Registered by conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

ALLOWED_SKIPS = Path(__file__).with_name("allowed_skips.txt")


def read_allowed_skips(path: Path = ALLOWED_SKIPS) -> dict[str, str]:
    """{test id: why it may skip} from `path`: one `test id | reason` a line, `#` comments."""
    allowed: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        test_id, _, reason = (part.strip() for part in line.partition("|"))
        if not test_id or not reason:
            raise pytest.UsageError(f"{path.name}:{number}: expected `test id | why`, got {line!r}")
        allowed[test_id] = reason
    return allowed


class SkipGate:
    """Fails the run when a test skips that tests/allowed_skips.txt does not list with a reason: the test
    command installs every package the suite needs, so a skip there is a missing check, not a detail."""

    def __init__(self, allowed: dict[str, str]) -> None:
        self.allowed = allowed
        self.unlisted: list[tuple[str, str]] = []

    def listed(self, test_id: str) -> bool:
        return any(test_id == a or test_id.startswith(f"{a}[") for a in self.allowed)

    def _note(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail") and not self.listed(report.nodeid):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.unlisted.append((report.nodeid, reason))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)  # a module-level `importorskip`

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.unlisted and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001 - pytest's own type
        if self.unlisted:
            terminalreporter.section(f"skipped, and not on {ALLOWED_SKIPS.name}", red=True)
            for test_id, reason in self.unlisted:
                terminalreporter.line(f"{test_id}: {reason}")
            terminalreporter.line(
                f"install what the test command installs, or list the test in {ALLOWED_SKIPS} with why"
            )
