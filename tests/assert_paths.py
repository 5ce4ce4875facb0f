"""Find tests that can pass without asserting anything: `python tests/assert_paths.py [paths...]`.

A test asserts when every path through its body reaches an `assert`, a `pytest.raises`/`pytest.warns`
block, a `raise`, `pytest.fail`/`pytest.skip`, an `assert_*` call (`torch.testing.assert_close`), or a call
to a function of the test suite that itself always asserts. What does not count: an assert under an `if`
whose other branch goes on without one; inside the body of a `for`/`while` loop that may run zero times
(one over a non-empty literal or a constant `range` does run); inside a `try` whose handler may swallow
it; inside a nested function or lambda (a callback may never be called); after an early `return`. So a
test that checks every element of a list must also check that the list is not empty.

Helpers are found by name among the functions and methods defined anywhere under tests/; a call counts
if every function of that name always asserts. tests/test_assert_paths.py runs this over the suite.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# what a path can do: reach an assert, leave the function without one, or go on to the next statement
ASSERTED, LEFT, GOES_ON = "asserted", "left", "goes on"
_ASSERTING_CONTEXTS = {"raises", "warns", "deprecated_call"}
_ASSERTING_CALLS = {"fail", "skip", "xfail"}  # pytest's: the test does not pass silently


@dataclass(frozen=True)
class Finding:
    path: Path
    line: int
    name: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name}: {self.why}"


def _called_names(node: ast.AST) -> Iterator[str]:
    """Names of the functions a statement calls, outside nested functions and lambdas."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Call):
            func = current.func
            if isinstance(func, ast.Name):
                yield func.id
            elif isinstance(func, ast.Attribute):
                yield func.attr
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                stack.append(child)


class _Paths:
    def __init__(self, asserting: set[str]) -> None:
        self.asserting = asserting

    def _statement_asserts(self, stmt: ast.stmt) -> bool:
        if isinstance(stmt, ast.Assert | ast.Raise):
            return True
        if isinstance(stmt, ast.With | ast.AsyncWith):
            for item in stmt.items:
                call = item.context_expr
                func = call.func if isinstance(call, ast.Call) else None
                if isinstance(func, ast.Attribute) and func.attr in _ASSERTING_CONTEXTS:
                    return True
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return False
        if isinstance(stmt, ast.If | ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith | ast.Try):
            return False  # their parts are walked by `block`
        return any(self.asserts(name) for name in _called_names(stmt))

    def asserts(self, name: str) -> bool:
        """A call that asserts: a helper of the suite that always does, `pytest.fail`/`skip`, `assert_*`
        (`torch.testing.assert_close`, ...)."""
        return name in self.asserting or name in _ASSERTING_CALLS or name.startswith("assert_")

    def block(self, body: Iterable[ast.stmt]) -> str:
        """ASSERTED if every path through `body` asserts, LEFT if one leaves without, else GOES_ON."""
        for stmt in body:
            if self._statement_asserts(stmt):
                return ASSERTED
            if isinstance(stmt, ast.Return):
                return LEFT
            if isinstance(stmt, ast.If):
                test_asserts = any(self.asserts(n) for n in _called_names(stmt.test))
                if test_asserts:
                    return ASSERTED
                outcomes = {self.block(stmt.body), self.block(stmt.orelse)}
                if outcomes == {ASSERTED}:
                    return ASSERTED
                if LEFT in outcomes:
                    return LEFT
            elif isinstance(stmt, ast.With | ast.AsyncWith):
                if any(self.asserts(n) for item in stmt.items for n in _called_names(item.context_expr)):
                    return ASSERTED
                outcome = self.block(stmt.body)
                if outcome != GOES_ON:
                    return outcome
            elif isinstance(stmt, ast.Try):
                final = self.block(stmt.finalbody)
                if final != GOES_ON:
                    return final
                outcome = self.block([*stmt.body, *stmt.orelse])
                handled = {self.block(handler.body) for handler in stmt.handlers}
                if outcome == ASSERTED and handled <= {ASSERTED}:  # no handler swallows the failure
                    return ASSERTED
                if LEFT in handled | {outcome}:
                    return LEFT
            elif isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
                # a loop may not run (only its else part and what follows count), unless it visibly does:
                # `while True`, or `for` over a non-empty literal or a constant `range`
                if _always_runs(stmt):
                    outcome = self.block(stmt.body)
                    if outcome != GOES_ON:
                        return outcome
                if self.block(stmt.orelse) == ASSERTED:
                    return ASSERTED
            elif isinstance(stmt, ast.Match):
                outcomes = {self.block(case.body) for case in stmt.cases}
                if outcomes == {ASSERTED}:
                    return ASSERTED
        return GOES_ON


def _always_runs(loop: ast.For | ast.AsyncFor | ast.While) -> bool:
    if isinstance(loop, ast.While):
        return isinstance(loop.test, ast.Constant) and bool(loop.test.value)
    items = loop.iter
    if isinstance(items, ast.Tuple | ast.List | ast.Set):
        return len(items.elts) > 0
    if isinstance(items, ast.Call) and isinstance(items.func, ast.Name) and items.func.id == "range":
        try:
            bounds = [ast.literal_eval(arg) for arg in items.args]
        except ValueError:
            return False
        return all(isinstance(b, int) for b in bounds) and len(range(*bounds)) > 0
    return False


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Module-level functions and methods of module-level classes (nested ones are not callable by name)."""
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))


def _parse(paths: Iterable[Path]) -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(paths)}


def asserting_functions(trees: dict[Path, ast.Module]) -> set[str]:
    """Names of the suite's functions that assert on every path (a fixpoint: helpers calling helpers)."""
    definitions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    for tree in trees.values():
        for func in _functions(tree):
            definitions.setdefault(func.name, []).append(func)
    asserting: set[str] = set()
    while True:
        paths = _Paths(asserting)
        found = {
            name
            for name, funcs in definitions.items()
            if not name.startswith("test_") and all(paths.block(f.body) == ASSERTED for f in funcs)
        }
        if found <= asserting:
            return asserting
        asserting |= found


def findings(test_files: Iterable[Path], helper_files: Iterable[Path] | None = None) -> list[Finding]:
    """Every test function in `test_files` that can pass without asserting."""
    test_files = list(test_files)
    trees = _parse(set(test_files) | set(helper_files if helper_files is not None else test_files))
    paths = _Paths(asserting_functions(trees))
    out = []
    for path in test_files:
        for func in _functions(trees[path]):
            if not func.name.startswith("test_"):
                continue
            outcome = paths.block(func.body)
            if outcome != ASSERTED:
                why = "a path returns without asserting" if outcome == LEFT else "no assert on every path"
                out.append(Finding(path, func.lineno, func.name, why))
    return out


def suite_files(root: Path = TESTS) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def main(argv: list[str]) -> int:
    everything = suite_files()
    targets = [Path(a).resolve() for a in argv] or [p for p in everything if p.name.startswith("test_")]
    found = findings(targets, everything)
    for finding in found:
        print(finding)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
