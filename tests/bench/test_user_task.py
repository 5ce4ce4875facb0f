"""The user's own model and data through the arena, and every bad input refused before anything trains."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from hf_hybrid.bench import BenchTask, Protocol, run_arena
from hf_hybrid.bench.methods import MethodError, parse_method
from hf_hybrid.data import DataError

TINY = Protocol(lr_multipliers=(1.0,), widen=0, schedule_check=False, warm_steps=1, timed_steps=1)


def _tiny_task():
    from hf_hybrid.bench.recipe import build_task, preset_recipe

    return build_task(preset_recipe("clm_stdlib", "tiny"))


# ---- the user's own model and data ----------------------------------------------------------------


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """A local model directory (tiny BERT, MiniLM's tokenizer) and a CSV with string labels."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from hf_hybrid.bench.tasks import minilm_path
    from hf_hybrid.data import stdlib_package_snippets

    root = tmp_path_factory.mktemp("user")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    )
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    train, _, names = stdlib_package_snippets(
        chars=96, train_per_label=12, eval_per_label=2, packages=("email", "xml", "http")
    )
    with open(root / "my.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "y"])
        writer.writerows([t, names[label]] for t, label in zip(train["text"], train["label"], strict=True))
    (root / "empty.csv").write_text("text,y\n")
    (root / "my.tsv").write_text("text\ty\n")
    return root


def _options(root, **changes):
    from hf_hybrid.bench.user_task import UserTaskOptions

    values = {
        "model_name_or_path": str(root / "model"),
        "dataset": str(root / "my.csv"),
        "task": "sequence_classification",
        "label_column": "y",
        "max_steps": 4,
        "max_length": 32,
        "per_device_train_batch_size": 4,
    }
    return UserTaskOptions(**{**values, **changes})


def test_a_users_csv_and_local_model_run_through_the_arena(user_files, tmp_path):
    from hf_hybrid.bench.user_task import build_user_task

    task = build_user_task(_options(user_files, max_steps=8))
    assert not (tmp_path / "labels.json").exists()  # written once the arena accepts every input
    assert len(task.evaluation) == math.ceil(0.15 * 36) and set(task.train["labels"]) == {0, 1, 2}
    protocol = TINY
    run_arena(task, ["plain", "freeze:1"], protocol, tmp_path, echo=lambda line: None)
    assert json.loads((tmp_path / "labels.json").read_text())["id2label"] == {
        "0": "email",
        "1": "http",
        "2": "xml",
    }
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["task"]["labels"] == ["email", "http", "xml"]
    assert [v["method"] for v in data["verdicts"]] == ["plain", "freeze:1"]
    assert all(math.isfinite(r["eval_loss"]) for r in data["runs"] if r["point"])
    # no --learning_rate: a range test set the races' centre, and every rate is a multiple of it
    (test,) = [r for r in data["runs"] if r["kind"] == "range_test"]
    base = data["decisions"]["base_learning_rate"]
    assert 0 < base < 10 and len(test["losses"]) == test["stop"]
    assert test["details"]["centre"] == base  # kept with the test: a later rule does not move the races
    assert test["key"] not in data["unused"] and data["plain"]["cost_plain_runs"]["range_test"] > 0
    assert all(
        r["learning_rate"] == pytest.approx(base * r["lr_multiplier"]) for r in data["runs"] if r["point"]
    )


def test_eval_rows_of_one_document_are_one_cluster_of_the_eval_noise(user_files, tmp_path):
    from hf_hybrid.bench.user_task import build_user_task

    with open(user_files / "my.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(tmp_path / "eval.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["text", "y", "file"])
        writer.writeheader()
        writer.writerows({**row, "file": f"doc{i // 3}.py"} for i, row in enumerate(rows[:12]))
    task = build_user_task(
        _options(user_files, eval_dataset=str(tmp_path / "eval.csv"), eval_group_column="file")
    )
    assert task.eval_clusters == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert "eval_group" not in task.evaluation.column_names and len(task.evaluation) == 12
    assert task.info["eval_groups"] == 4
    assert (
        build_user_task(_options(user_files, eval_dataset=str(tmp_path / "eval.csv"))).eval_clusters is None
    )
    with pytest.raises(DataError, match=r"`--eval_group_column` 'doc' is not a column of .*eval.csv"):
        build_user_task(
            _options(user_files, eval_dataset=str(tmp_path / "eval.csv"), eval_group_column="doc")
        )
    with pytest.raises(DataError, match=r"`--eval_group_column` needs one example per row"):
        build_user_task(_options(user_files, task="causal_lm", eval_group_column="file"))


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if anything trains or calibrates."""
    import hf_hybrid.bench.calibration as calibration
    import hf_hybrid.bench.executors as executors

    def refuse(*args, **kwargs):
        raise AssertionError("trained before the bad input was refused")

    monkeypatch.setattr(executors, "run_spec", refuse)
    monkeypatch.setattr(calibration, "_forward_seconds", refuse)
    monkeypatch.setattr(calibration, "_step_seconds", refuse)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_name_or_path": "./no/such/model"}, r"`--model_name_or_path` ./no/such/model does not exist"),
        (
            {"text_column": "body"},
            r"`--text_column` 'body' is not a column of .*my.csv; its columns: \['text', 'y'\]",
        ),
        (
            {"label_column": "label"},
            r"`--label_column` 'label' is not a column of .*; its columns: \['text', 'y'\]",
        ),
        ({"dataset": "EMPTY"}, r"empty.csv is empty \(0 rows\)"),
        ({"dataset": "no_such.csv"}, r"`--dataset` no_such.csv does not exist"),
        ({"dataset": "TSV"}, r"a file must end in one of \['.csv', '.json', '.jsonl', '.txt'\]"),
        ({"task": "regression"}, r"`--task` must be one of \['causal_lm', 'sequence_classification'\]"),
    ],
)
def test_bad_data_and_model_inputs_are_refused_before_training(
    user_files, tmp_path, no_training, changes, message
):
    from hf_hybrid.bench.user_task import build_user_task

    paths = {
        "EMPTY": str(user_files / "empty.csv"),
        "TSV": str(user_files / "my.tsv"),
    }
    changes = {k: paths.get(v, v) for k, v in changes.items()}
    with pytest.raises(DataError, match=message):
        build_user_task(_options(user_files, **changes))


def test_a_bad_method_or_budget_is_refused_before_training(user_files, tmp_path, no_training):
    from hf_hybrid.bench.user_task import build_user_task

    task = build_user_task(_options(user_files))
    with pytest.raises(MethodError, match="unknown method 'frobnicate'; methods: "):
        run_arena(task, ["plain", "frobnicate"], Protocol(), tmp_path)
    task.max_steps = 3
    with pytest.raises(
        DataError, match=r"`--max_steps` 3 is too small for branches at 1/4, 1/2 and 3/4.*>= 8"
    ):
        run_arena(task, ["plain"], Protocol(), tmp_path)
    with pytest.raises(DataError, match=r"`--cooldown_fraction` must be in \(0, 0.5\], got 0.7"):
        run_arena(task, ["plain"], Protocol(cooldown=0.7), tmp_path)
    task.max_steps = 8
    with pytest.raises(MethodError, match=r"BertForSequenceClassification has 2 blocks; k must be <= 2"):
        run_arena(task, ["plain", "freeze:5"], Protocol(), tmp_path)
    with pytest.raises(DataError, match="`null` adds the null control of the other methods listed, and none"):
        run_arena(task, ["plain", "freeze:1", "null"], Protocol(), tmp_path)
    assert list(tmp_path.iterdir()) == []  # a refused command leaves nothing behind


def test_the_command_line_prints_one_error_line_for_a_bad_input(user_files, tmp_path, capsys, no_training):
    from hf_hybrid.cli import main

    code = main(
        [
            "bench",
            "--model_name_or_path",
            str(user_files / "model"),
            "--dataset",
            str(user_files / "my.csv"),
            "--task",
            "sequence_classification",
            "--label_column",
            "z",
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        f"hf-hybrid bench: error: `--label_column` 'z' is not a column of {user_files / 'my.csv'}; "
        "its columns: ['text', 'y']"
    ]


def test_list_methods_describes_every_method(capsys):
    from hf_hybrid.cli import main

    assert main(["bench", "--list_methods"]) == 0
    out = capsys.readouterr().out
    for name in (
        "plain",
        "hybrid",
        "hybrid-predict",
        "null",
        "freeze",
        "selective-backprop",
        "dropbp",
        "args",
    ):
        assert f"  {name}: " in out


def test_a_task_factory_returns_a_bench_task(tmp_path, monkeypatch):
    import argparse

    from hf_hybrid.bench_cli import add_bench_parser, task_from_factory

    parser = argparse.ArgumentParser()
    bench = add_bench_parser(parser.add_subparsers())
    args = bench.parse_args(["--task_factory", "test_user_task:_tiny_task", "--max_steps", "8"])
    task = task_from_factory(args)
    assert isinstance(task, BenchTask) and task.max_steps == 8
    args = bench.parse_args(["--task_factory", "bench_plugins:CountingCallback"])
    with pytest.raises(DataError, match="must be a function returning a hf_hybrid.bench.BenchTask"):
        task_from_factory(args)


def test_a_method_subclass_by_import_path_takes_options_and_prices_its_own_kinds(tmp_path):
    """The docs' method example (examples/arena_method.py) is an arena plug-in by import path: its options
    are checked, its frozen step is a kind of its own, priced by a run made only of it, and counted."""
    spec = "examples.arena_method:FreezeAfter:k=1,after=2"
    method = parse_method(spec)
    assert (method.k, method.after) == (1, 2)
    with pytest.raises(MethodError, match=r"`k`.*>= 0"):
        parse_method(spec.replace("k=1", "k=-1"))
    run_arena(_tiny_task(), ["plain", spec], TINY, tmp_path, echo=lambda line: None)
    data = json.loads((tmp_path / "results.json").read_text())
    runs = [r for r in data["runs"] if r["method"] == spec]
    frozen = f"{spec}:frozen"
    from_start = [r for r in runs if r["start"] == 0]
    assert from_start and all(r["step_counts"] == {"step": 2, frozen: r["stop"] - 2} for r in from_start)
    assert data["calibration"]["units"][frozen] > 0
    assert any(v["method"] == spec for v in data["verdicts"])
