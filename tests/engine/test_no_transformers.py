"""The engine is plain PyTorch: importing any engine module must not import transformers.

Each check runs in a fresh interpreter (this test process has long imported transformers through
other tests). Two checks:

* through the package, as users import it (``import hf_hybrid.engine.engine``): this also needs
  ``hf_hybrid/__init__.py`` to stay lazy, since it runs first;
* with ``hf_hybrid`` replaced by an empty stub package pointing at the same directory, so the engine
  modules are judged on their own imports, whatever ``hf_hybrid/__init__.py`` does.

After each module the interpreter's ``sys.modules`` is inspected, so a failure names the first module
that pulled transformers in. The module list is read from the engine directory, so new engine modules
are covered without editing this file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hf_hybrid

PACKAGE_DIR = Path(hf_hybrid.__file__).resolve().parent
ENGINE_MODULES = sorted(
    f"hf_hybrid.engine.{path.stem}"
    for path in (PACKAGE_DIR / "engine").glob("*.py")
    if path.stem != "__init__"
)

_CHECK = r"""
import importlib, json, sys, types
modules, stub, package_dir = json.loads(sys.argv[1]), sys.argv[2] == "stub", sys.argv[3]
if stub:
    parent = types.ModuleType("hf_hybrid")
    parent.__path__ = [package_dir]
    sys.modules["hf_hybrid"] = parent
offenders = {}
for name in ["hf_hybrid.engine", *modules]:
    importlib.import_module(name)
    loaded = sorted(m for m in sys.modules if m == "transformers" or m.startswith("transformers."))
    if loaded:
        offenders[name] = loaded[:5]
        break
engine_file = sys.modules["hf_hybrid.engine"].__file__
assert engine_file.startswith(package_dir), engine_file
imported = sorted(m for m in sys.modules if m.startswith("hf_hybrid"))
print(json.dumps({"offenders": offenders, "imported": imported}))
"""


def _run_check(mode: str) -> dict[str, object]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_DIR.parent), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK, json.dumps(ENGINE_MODULES), mode, str(PACKAGE_DIR)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=PACKAGE_DIR.parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_engine_modules_found() -> None:
    assert {"hf_hybrid.engine.engine", "hf_hybrid.engine.phases", "hf_hybrid.engine.guard"} <= set(
        ENGINE_MODULES
    )


@pytest.mark.parametrize("mode", ["package", "stub"])
def test_engine_never_imports_transformers(mode: str) -> None:
    result = _run_check(mode)
    assert result["offenders"] == {}, f"importing these pulled in transformers: {result['offenders']}"
    assert set(ENGINE_MODULES) <= set(result["imported"])  # type: ignore[arg-type]
    if mode == "package":
        # the lazy package __init__ must not have imported the trainer either
        assert "hf_hybrid.trainer" not in result["imported"]  # type: ignore[operator]
