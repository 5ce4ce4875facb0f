"""Two house rules of `hf_hybrid/`, checked from the source (AST, nothing imported).

    python scripts/check_house.py                  # the whole package; exit 1 if any rule is broken
    python scripts/check_house.py --max_lines 60   # the function length limit (default 60)
    python scripts/check_house.py --exclude hf_hybrid/bench hf_hybrid/bench_cli.py   # leave some out

- No function longer than `--max_lines` lines (from its `def` to its last line, docstring included):
  a longer one does several things, and a reader has to hold them all at once.
- No import cycle between the package's modules. Every import counts, wherever it sits: inside a
  function (an import put off to dodge a cycle is still one) and under `TYPE_CHECKING` (the types still
  say that each module needs the other). `from .pkg import name` depends on `pkg.name` when that is a
  module, else on `pkg`'s `__init__`.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "hf_hybrid"


def modules(package_dir: Path) -> dict[str, Path]:
    """{dotted module name: file} for every module of the package (an `__init__.py` is its package)."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def long_functions(path: Path, max_lines: int) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length) of each function in `path` longer than `max_lines`."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = child.end_lineno - child.lineno + 1
                    if length > max_lines:
                        found.append((name, child.lineno, length))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in known]
            if len(targets) < len(node.names):
                targets.append(source)
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)


def excluded(path: Path, exclude: list[Path]) -> bool:
    return any(path == e or e in path.parents for e in exclude)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_lines", type=int, default=60)
    parser.add_argument("--exclude", nargs="*", default=[], help="files or folders, relative to the repo")
    args = parser.parse_args(argv)
    exclude = [(ROOT / e).resolve() for e in args.exclude]
    found = modules(ROOT / PACKAGE)
    checked = {name: path for name, path in found.items() if not excluded(path.resolve(), exclude)}
    problems = 0
    for path in sorted(set(checked.values())):
        for function, line, length in long_functions(path, args.max_lines):
            print(f"{path.relative_to(ROOT)}:{line}: {function} is {length} lines (limit {args.max_lines})")
            problems += 1
    graph = {name: imported_modules(name, path, set(found)) for name, path in found.items()}
    for component in cycles(graph):
        if any(name in checked for name in component):
            print(f"import cycle: {' <-> '.join(component)}")
            problems += 1
    print(f"{problems} problem(s)" if problems else "clean", f"({len(checked)} modules checked)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
