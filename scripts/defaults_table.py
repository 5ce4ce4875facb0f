"""The README's table of the `hybrid_*` arguments, generated from `HybridArgumentsMixin`: each field's
default and its help, so that the README states every default once and cannot disagree with the code.

    python scripts/defaults_table.py           # rewrite the table in README.md
    python scripts/defaults_table.py --check   # exit 1 when it is stale (tests/test_readme_defaults.py)
"""

from __future__ import annotations

import re
import sys
from dataclasses import MISSING, Field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hf_hybrid.hybrid_arguments import hybrid_fields  # noqa: E402

README = ROOT / "README.md"
START = "<!-- defaults-table:start -->"
END = "<!-- defaults-table:end -->"
# "(default: the training `seed`)" in a help text says what a None default means
DEFAULT_IN_HELP = re.compile(r"\s*\(default: ([^)]*)\)")


def default_value(f: Field) -> object:
    return f.default_factory() if f.default is MISSING else f.default


def default_text(f: Field) -> str:
    """The default as the table shows it: a word or a number, or for None what the help says it means."""
    value = default_value(f)
    if value is None:
        said = DEFAULT_IN_HELP.search(f.metadata.get("help", ""))
        return said.group(1) if said else "none"
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else f"`{value}`"


def what_it_does(f: Field) -> str:
    text = DEFAULT_IN_HELP.sub("", f.metadata.get("help", "")).strip()
    choices = f.metadata.get("choices")
    if choices:
        text += " One of " + ", ".join(f"`{c}`" for c in choices) + "."
    return text.replace("|", "\\|")


def table() -> str:
    lines = ["| argument | default | what it does |", "|---|---|---|"]
    lines += [f"| `{f.name}` | {default_text(f)} | {what_it_does(f)} |" for f in hybrid_fields()]
    return "\n".join(lines)


def block_of(text: str) -> str:
    """What stands between the markers of `text` (README.md's), without the surrounding blank lines."""
    if START not in text or END not in text:
        raise SystemExit(f"README.md has no {START} ... {END} block")
    return text.partition(START)[2].partition(END)[0].strip("\n")


def main(argv: list[str]) -> int:
    text = README.read_text()
    generated = table()
    if "--check" in argv:
        stale = block_of(text) != generated
        if stale:
            print(
                "README.md's table of the hybrid_* arguments is stale: run python scripts/defaults_table.py"
            )
        return int(stale)
    before, _, rest = text.partition(START)
    after = rest.partition(END)[2]
    README.write_text(f"{before}{START}\n{generated}\n{END}{after}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
