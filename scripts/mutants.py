"""Plant, one at a time, the bugs the test suite exists to catch, and run the tests that should catch each.

    python scripts/mutants.py              # every mutant; a table; exit 0 iff the tests pass unmutated
    python scripts/mutants.py --only a c   # some of them                 and every mutant is caught
    python scripts/mutants.py --list       # the table of mutants, nothing run

Each mutant is data (`MUTANTS`): a source file, exact text to replace (it must occur exactly once, so a
refactor that moves the code makes the mutant fail loudly as "not planted" instead of passing
silently), the replacement, and the test ids that should fail. The working tree is never edited: the
tracked and untracked-but-not-ignored files are copied to a temporary folder once, each mutant is
planted in that copy and taken out again (the copy is compared with the original afterwards), and
pytest runs there with the copy first on PYTHONPATH (subprocess tests included), so the editable install
of this tree is not what is tested. The tests first run once on the unmutated copy: a mutant "caught" by
tests that fail anyway would prove nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    key: str
    claim: str  # what the tests must protect, in a few words
    path: str  # relative to the repository root
    edits: tuple[tuple[str, str], ...]  # (exact old text, new text), each old text once in the file
    tests: tuple[str, ...]  # pytest ids run against it


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "a",
        "a step the spike guard skips applies its update anyway",
        "hf_hybrid/engine/engine.py",
        (
            (
                "            if not finite and not skip_nonfinite:"
                "  # a GradScaler must see it (it skips it itself)\n",
                "            if finite or not skip_nonfinite:  # mutant: a skipped finite step is applied\n",
            ),
        ),
        (
            "tests/test_trainer_spike_guard.py::test_a_skipped_step_changes_no_weight_and_no_optimizer_state",
            "tests/engine/test_spike_guard.py::test_a_bad_batch_is_blamed_skipped_and_changes_nothing",
        ),
    ),
    Mutant(
        "b",
        "a restore puts back the weights but not the optimizer state",
        "hf_hybrid/engine/guard_copies.py",
        (
            (
                "        for saved, p in zip(self.state, params, strict=True):\n",
                "        return\n        for saved, p in zip(self.state, params, strict=True):\n",
            ),
        ),
        (
            "tests/test_trainer_spike_guard.py::test_a_restore_puts_back_the_trusted_copy_exactly",
            "tests/engine/test_spike_guard.py::test_a_restore_puts_back_the_trusted_copy_exactly",
        ),
    ),
    Mutant(
        "c",
        "the frontier's interpolation skips its first segment",
        "hf_hybrid/bench/frontier.py",
        (
            (
                "zip(frontier, frontier[1:], strict=False)",
                "zip(frontier[1:], frontier[2:], strict=False)",
            ),
        ),
        ("tests/test_frontier_arithmetic.py",),
    ),
    Mutant(
        "d",
        "a checked predict step runs the backward",
        "hf_hybrid/trainer.py",
        (
            (
                "                loss = self._forward_only_step(model, inputs, num_items_in_batch)\n",
                "                loss = super().training_step(model, inputs, num_items_in_batch)\n",
            ),
        ),
        (
            "tests/test_trainer_phases.py::test_predict_steps_skip_backward_and_apply_exactly_the_guarded_delta",
        ),
    ),
    Mutant(
        "e",
        "the null control applies something (the last real update)",
        "hf_hybrid/engine/predictor.py",
        (
            (
                '    name = "null"\n    needs_deltas = False\n\n'
                "    def observe(self, deltas: Mapping[str, torch.Tensor]) -> None:\n"
                "        self.observed += 1\n\n"
                "    def predict(self, steps_ahead: int) -> Deltas | None:\n"
                "        return None\n",
                '    name = "null"\n    needs_deltas = True\n\n'
                "    def observe(self, deltas: Mapping[str, torch.Tensor]) -> None:\n"
                "        self.last = {k: v.clone() for k, v in deltas.items()}\n"
                "        self.observed += 1\n\n"
                "    def predict(self, steps_ahead: int) -> Deltas | None:\n"
                '        return dict(getattr(self, "last", {})) or None\n',
            ),
        ),
        (
            "tests/test_trainer_phases.py::test_the_null_predictor_applies_nothing",
            "tests/engine/test_engine.py::TestNullPredictor",
        ),
    ),
    Mutant(
        "f",
        "a resume drops the engine's random generator (the horizon bandit's)",
        "hf_hybrid/engine/bandit.py",
        (
            (
                "        self._generator.set_state("
                'torch.tensor(state["generator_state"], dtype=torch.uint8))\n',
                "",
            ),
        ),
        ("tests/engine/test_bandit.py",),
    ),
    Mutant(
        "g",
        "the verdict ignores the band: any reading above 1.0x wins",
        "hf_hybrid/bench/protocol.py",
        (("    if log > width:\n", "    if log > 0:\n"), ("    if log < -width:\n", "    if log < 0:\n")),
        (
            "tests/bench/test_protocol.py",
            "tests/bench/test_plan.py::test_a_method_as_good_as_plain_with_its_own_noise_reads_a_tie",
        ),
    ),
    Mutant(
        "j",
        "a method stops early at one band below 1.0x, not two",
        "hf_hybrid/bench/protocol.py",
        (("math.log(speedup) < -2 * band.half_width()", "math.log(speedup) < -band.half_width()"),),
        ("tests/bench/test_protocol.py",),
    ),
    Mutant(
        "k",
        "every seed's method run is read against the first seed's plain run, not its own (unpaired)",
        "hf_hybrid/bench/reading.py",
        (
            (
                "    pairs = [(rows[s], evidence.plain_full[s] if full else evidence.at(budget)) "
                "for s in seeds]",
                "    pairs = [(rows[s], evidence.plain_full[first] if full else evidence.at(budget)) "
                "for s in seeds]",
            ),
        ),
        ("tests/bench/test_plan.py::test_every_verdict_reads_the_full_budget_paired_with_plain_s_seeds",),
    ),
    Mutant(
        "l",
        "eval noise resampled by example, not by cluster (the band too narrow)",
        "hf_hybrid/bench/protocol.py",
        (("else np.unique(np.asarray(clusters), return_inverse=True)[1]", "else np.arange(d.size)"),),
        ("tests/bench/test_protocol.py",),
    ),
    Mutant(
        "m",
        "a time verdict's interval is one standard error of its pairs, not their t interval",
        "hf_hybrid/bench/protocol.py",
        (
            (
                "    half = t_quantile(CONFIDENCE, len(logs) - 1) * statistics.stdev(logs) / "
                "math.sqrt(len(logs))",
                "    half = statistics.stdev(logs) / math.sqrt(len(logs))",
            ),
        ),
        ("tests/bench/test_null_records.py", "tests/bench/test_protocol.py"),
    ),
    Mutant(
        "h",
        "a sleeping engine writes a weight (through its sampled view of the parameters)",
        "hf_hybrid/engine/updates.py",
        (
            (
                "            current = self._current()\n            delta = current - self._flat\n",
                "            current = self._current()\n"
                "            for name, p in self.params.items():\n"
                "                self._view(name, p).add_(1e-3)\n"
                "            delta = current - self._flat\n",
            ),
        ),
        (
            "tests/test_trainer_fidelity.py::test_the_true_defaults_are_the_plain_trainer_past_the_warmup",
            "tests/test_trainer_fidelity.py::test_warmup_and_full_steps_are_bit_identical",
        ),
    ),
    Mutant(
        "i",
        "the spike guard stops handing the detector's gradient-norm ratio to the update check",
        "hf_hybrid/engine/spike_guard.py",
        (
            (
                "self.update_check.take(step, lrs, self.detector.grad_ratio(self.step_grad_norm))",
                "self.update_check.take(step, lrs, None)",
            ),
        ),
        (
            "tests/engine/test_spike_guard.py::test_a_gradient_spike_under_sgd_is_taken_back_through_the_detectors_ratio",
        ),
    ),
)


def _copy_tree(dest: Path) -> None:
    """The files git would commit (tracked, and untracked but not ignored), as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def _pytest(copy: Path, tests: list[str], stop_at_first_failure: bool) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")])}
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        *(["-x"] * stop_at_first_failure),
    ]
    started = time.monotonic()
    proc = subprocess.run([*command, *tests], cwd=copy, env=env, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def _check_imports_the_copy(copy: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    code = "import hf_hybrid, sys; sys.stdout.write(hf_hybrid.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", code], cwd=copy / "tests", env=env, capture_output=True, text=True
    )
    if not where.stdout.startswith(str(copy)):
        raise SystemExit(f"the copy's hf_hybrid is not the one imported ({where.stdout or where.stderr})")


def _plant(copy: Path, mutant: Mutant) -> str | None:
    """Plant `mutant` in the copy; the original text back is the caller's job. None, or why it failed."""
    path = copy / mutant.path
    text = path.read_text()
    for old, new in mutant.edits:
        if text.count(old) != 1:
            return f"not planted: its text occurs {text.count(old)} times in {mutant.path} (re-target it)"
        text = text.replace(old, new)
    path.write_text(text)
    return None


def _summary(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if " passed" in line or " failed" in line]
    return lines[-1].strip("= ") if lines else output.strip().splitlines()[-1] if output.strip() else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", metavar="KEY", help="run only these mutants")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    opts = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not opts.only or m.key in opts.only]
    if opts.only and len(chosen) != len(set(opts.only)):
        parser.error(f"unknown mutant in {opts.only}; mutants: {[m.key for m in MUTANTS]}")
    if opts.list:
        for m in MUTANTS:
            print(f"{m.key}  {m.claim}  ({m.path})\n   tests: {' '.join(m.tests)}")
        return 0

    copy = Path(tempfile.mkdtemp(prefix="hf_hybrid_mutants_"))
    started = time.monotonic()
    try:
        _copy_tree(copy)
        _check_imports_the_copy(copy)
        tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
        code, output, seconds = _pytest(copy, tests, stop_at_first_failure=False)
        print(f"unmutated: {_summary(output)} ({seconds:.0f} s)")
        if code != 0:
            print(output[-4000:])
            print("the tests fail without any mutant: no mutant can be judged")
            return 1
        rows = []
        for mutant in chosen:
            original = (copy / mutant.path).read_text()
            problem = _plant(copy, mutant)
            try:
                if problem is None:
                    code, output, seconds = _pytest(copy, list(mutant.tests), stop_at_first_failure=True)
                    # exit code 1: tests ran and failed. 0: all passed (missed); others: could not run
                    caught = {1: "yes", 0: "NO"}.get(code, f"error (pytest exit {code})")
                    if caught != "yes":
                        print(f"--- mutant {mutant.key}: pytest output ---\n{output[-3000:]}")
                else:
                    caught, output, seconds = problem, "", 0.0
            finally:
                (copy / mutant.path).write_text(original)
            rows.append((mutant, caught, _summary(output), seconds))
        if (copy / "hf_hybrid").exists():
            for mutant in chosen:  # the copy is back to the tree as it was: nothing leaks into a later run
                if (copy / mutant.path).read_text() != (ROOT / mutant.path).read_text():
                    raise SystemExit(f"{mutant.path} was not restored in the copy")
    finally:
        if opts.keep:
            print(f"copy kept: {copy}")
        else:
            shutil.rmtree(copy, ignore_errors=True)

    print("\n| mutant | what is planted | tests run | their result | caught | seconds |")
    print("|---|---|---|---|---|---|")
    for mutant, caught, summary, seconds in rows:
        tests = ", ".join(t.removeprefix("tests/") for t in mutant.tests)
        what = f"{mutant.claim} ({mutant.path})"
        print(f"| {mutant.key} | {what} | {tests} | {summary} | {caught} | {seconds:.0f} |")
    missed = [m.key for m, caught, *_ in rows if caught != "yes"]
    print(f"\n{len(rows) - len(missed)} of {len(rows)} caught in {time.monotonic() - started:.0f} s", end="")
    print(f"; not caught: {missed}" if missed else "")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
