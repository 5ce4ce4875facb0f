"""`hf-hybrid bench` refuses a bad method, flag or column before any data work (`bench/precheck.py`).

"Before any data work" is asserted by what ran, not by a clock: the functions that read the data, load
a tokenizer or a model, and build the task are replaced by ones that fail the test, and a subprocess
records the modules a refusal imported (no torch, transformers, datasets or peft).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hf_hybrid.bench.methods import registry
from hf_hybrid.bench.precheck import BUILTIN_METHODS, columns_of
from hf_hybrid.cli import main

ROWS = 100_000


@pytest.fixture(scope="module")
def big_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("user") / "big.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows([f"row {i}: some text of the user's task", i % 3] for i in range(ROWS))
    return path


@pytest.fixture
def no_data_work(monkeypatch):
    """Fail the test if the data is read, a tokenizer or model is loaded, or the task is built."""
    import datasets
    import transformers

    from hf_hybrid.bench import user_task

    def refuse(*args, **kwargs):
        raise AssertionError("data work began before the bad input was refused")

    for owner, name in (
        (user_task, "build_user_task"),
        (user_task, "read_table"),
        (datasets, "load_dataset"),
        (transformers.AutoTokenizer, "from_pretrained"),
        (transformers.AutoConfig, "from_pretrained"),
        (transformers.AutoModelForSequenceClassification, "from_pretrained"),
        (transformers.AutoModelForCausalLM, "from_pretrained"),
    ):
        monkeypatch.setattr(owner, name, refuse)


def _bench(capsys, *argv: str) -> str:
    assert main(["bench", *argv]) == 2
    return capsys.readouterr().err


def _user_task(csv_path: Path, *more: str) -> list[str]:
    return ["--model_name_or_path", str(csv_path.parent / "model"), "--dataset", str(csv_path), *more]


def test_a_misspelt_method_is_refused_with_the_known_ones_before_any_data_work(big_csv, no_data_work, capsys):
    err = _bench(
        capsys, *_user_task(big_csv, "--task", "sequence_classification", "--methods", "plain", "hybird")
    )
    assert "unknown method 'hybird'" in err
    assert all(name in err for name in ("hybrid", "hybrid-predict", "freeze", "dropbp", "module.path:Name"))


REFUSAL_PROBE = """
import json, sys
from hf_hybrid.cli import main
code = main(sys.argv[1:])
heavy = sorted({name.split(".")[0] for name in sys.modules} & {"torch", "transformers", "datasets", "peft"})
print("RESULT", json.dumps({"code": code, "heavy": heavy}))
"""


def test_the_refusal_imports_no_ml_library(big_csv):
    """The reason it takes about a second on a 100,000-row CSV: nothing heavy is imported, nothing read
    past the header (torch and transformers alone take seconds to import)."""
    argv = ["bench", *_user_task(big_csv, "--methods", "hybird")]
    done = subprocess.run(
        [sys.executable, "-c", REFUSAL_PROBE, *argv], capture_output=True, text=True, check=True, timeout=120
    )
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(line.removeprefix("RESULT ")) == {"code": 2, "heavy": []}
    assert "unknown method 'hybird'" in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "plain", "plain"], "lists a method twice"),
        (["--seeds", "0", "0"], "`--seeds` must be distinct"),
        (["--lr_multipliers", "1", "-2"], "`--lr_multipliers` must be positive"),
        (["--widen", "-1"], "`--widen` must be >= 0"),
        (["--max_steps", "4"], "`--max_steps` 4 is too small"),
        (["--cooldown_fraction", "0.9"], "`--cooldown_fraction` must be in (0, 0.5]"),
        (["--text_column", "body"], "`--text_column` 'body' is not a column of"),
        (["--task", "sequence_classification", "--label_column", "y"], "its columns: ['text', 'label']"),
        (["--methods", "freeze:x"], "`k` must be int"),  # options: the full reading, before the data too
        (["--methods", "no_such_module.tricks:Fast"], "cannot import module 'no_such_module.tricks'"),
        (["--methods", "plain", "freeze:2", "null"], "none of them has one"),
    ],
)
def test_every_flag_and_spec_is_refused_before_any_data_work(big_csv, no_data_work, capsys, argv, message):
    assert message in _bench(capsys, *_user_task(big_csv, *argv))


def test_good_methods_and_columns_reach_the_task(big_csv, monkeypatch, capsys):
    """The nearest accepted input goes past every check, to building the task (a check that refused
    everything would fail here)."""
    from hf_hybrid.bench import user_task

    def reached(options):
        raise user_task.DataError(f"reached the task: {options.label_column}")

    monkeypatch.setattr(user_task, "build_user_task", reached)
    argv = ["--task", "sequence_classification", "--methods", "plain", "hybrid", "null", "freeze:2"]
    argv += ["--seeds", "0", "1", "--max_steps", "8"]
    assert "reached the task: label" in _bench(capsys, *_user_task(big_csv, *argv))


def test_the_columns_come_from_the_first_line_or_the_saved_features(tmp_path):
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": f"t{i}", "y": i % 2}) + "\n" for i in range(3)))
    assert columns_of(jsonl) == ["text", "y"]
    document = tmp_path / "pretty.json"
    document.write_text(json.dumps([{"text": "a"}], indent=2))
    assert columns_of(document) is None  # not told by its first line: left to the full read
    assert columns_of(tmp_path / "corpus.txt") is None  # does not exist: the options check says so
    (tmp_path / "corpus.txt").write_text("a line\n")
    assert columns_of(tmp_path / "corpus.txt") == ["text"]
    from datasets import Dataset, DatasetDict

    rows = Dataset.from_dict({"sentence": ["a", "b"], "label": [0, 1]})
    rows.save_to_disk(str(tmp_path / "saved"))
    DatasetDict(train=rows, validation=rows).save_to_disk(str(tmp_path / "splits"))
    assert columns_of(tmp_path / "saved") == columns_of(tmp_path / "splits") == ["sentence", "label"]


def test_no_builtin_method_is_refused_by_name():
    """Every name the registry has is in the light list (else the light check would refuse it); a name
    the registry lacks would only pass to the full reading, which refuses it, still before the data."""
    assert set(registry._BUILTINS) | {registry.NULL} <= set(BUILTIN_METHODS)
