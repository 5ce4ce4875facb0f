"""docs/layout.md lists every module of `hf_hybrid/` (a module nobody can find is a module nobody keeps)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_of_the_package_is_in_the_layout():
    text = (ROOT / "docs" / "layout.md").read_text()
    block = re.search(r"```\nhf_hybrid/\n(.*?)```", text, re.S).group(1)
    listed = set(re.findall(r"[\w.]+\.py|\w+/", block))
    package = ROOT / "hf_hybrid"
    modules = {p.name for p in package.rglob("*.py") if p.name != "__init__.py"}
    folders = {f"{p.name}/" for p in package.rglob("*") if p.is_dir() and (p / "__init__.py").exists()}
    assert not modules - listed, f"modules missing from docs/layout.md: {sorted(modules - listed)}"
    assert not folders - listed, f"packages missing from docs/layout.md: {sorted(folders - listed)}"
