"""scripts/check_house.py: each rule catches what it names, on small files written for it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_house", ROOT / "scripts" / "check_house.py")
house = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(house)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


LATE = """
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import torch

def f():
    import json
    import matplotlib.figure
    import transformers
    from pkg import light_mod, heavy_mod
"""


def test_imports_inside_functions_are_allowed_only_as_the_rule_says(tmp_path):
    path = _write(tmp_path, "mod.py", LATE)
    found = {"pkg.light_mod": path, "pkg.heavy_mod": path, "pkg.mod": path}
    heavy = house.late_imports("pkg.mod", path, found, light={"pkg.light_mod"})
    assert sorted(target for _, target in heavy) == ["json", "pkg.heavy_mod", "pkg.light_mod", "transformers"]
    light = house.late_imports("pkg.mod", path, found, light={"pkg.mod", "pkg.light_mod"})
    assert sorted(target for _, target in light) == ["json", "pkg.light_mod"]  # the light ones only


def test_the_light_modules_are_what_help_loads():
    light = house.light_modules(house.modules(ROOT / "hf_hybrid"))
    assert {"hf_hybrid", "hf_hybrid.cli", "hf_hybrid.recipes.common", "hf_hybrid.hybrid_arguments"} <= light
    assert not {"hf_hybrid.trainer", "hf_hybrid.engine.engine", "hf_hybrid.tiny_models"} & light


def test_a_second_byte_level_gpt2_is_found(tmp_path):
    path = _write(
        tmp_path,
        "tasks.py",
        "a = GPT2Config(vocab_size=256, n_embd=64)\nb = transformers.GPT2Config(n_positions=1024)\n",
    )
    assert house.byte_gpt2_configs([path]) == [(path, 1)]


def test_two_classes_computing_z_scores_are_two_detectors(tmp_path, monkeypatch):
    monkeypatch.setattr(house, "ROOT", tmp_path)
    one = _write(
        tmp_path, "one.py", "class A:\n    def z(self, x):\n        return (x - self.m) / self.std()\n"
    )
    two = _write(tmp_path, "two.py", "def z(x, level, noise):\n    return (x - level) / noise\n")
    other = _write(tmp_path, "other.py", "def f(a, b, scale):\n    return (a - b) / scale\n")
    assert house.z_score_owners([one, two, other]) == {"one.py:A": 3, "two.py": 2}


def test_packing_and_long_classes_are_found(tmp_path):
    packed = _write(tmp_path, "packed.py", "x = [\n  1, 2,\n]  # fmt: skip\ny = 1\n")
    assert house.packing([packed]) == [(packed, 3)]
    body = "".join(f"    x{i} = {i}\n" for i in range(5))
    long = _write(tmp_path, "long.py", f"class C:\n{body}    def f(self):\n        return 1\n")
    assert house.long_definitions(long, max_lines=60, max_class_lines=5) == [("C", 1, 8, 5)]
