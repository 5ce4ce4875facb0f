"""A user's causal-LM data of varied lengths, one example per row: what packing and length grouping work on,
through `hf-hybrid bench` as a new user runs it; data of one length has nothing to gain."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from hf_hybrid.bench.methods import parse_method
from hf_hybrid.bench.methods.packing import PadToLongest
from hf_hybrid.bench.user_task import UserTaskOptions, build_user_task
from hf_hybrid.cli import main
from hf_hybrid.data import DataError


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny GPT-2 saved with MiniLM's tokenizer, a CSV of prompts and answers of varied lengths (signatures
    and their docstrings' summaries) and a CSV whose texts all have one length."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from hf_hybrid.bench.instruct import docstring_pairs, unseen_files
    from hf_hybrid.bench.tasks import minilm_path

    root = tmp_path_factory.mktemp("rows")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=tokenizer.vocab_size,
        n_positions=64,
        n_embd=16,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )
    GPT2LMHeadModel(config).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    with open(root / "mixed.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["prompt", "text"])
        pairs = [p for path in unseen_files()[:8] for p in docstring_pairs(path, path.name)]
        writer.writerows([p.prompt.decode(), p.response.decode()] for p in pairs[:60])
    with open(root / "same.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text"])
        writer.writerows([f"the same words in every row, row {chr(97 + i % 26)}"] for i in range(60))
    return root


def _options(files, dataset: str, **changes) -> UserTaskOptions:
    values = {
        "model_name_or_path": str(files / "model"),
        "dataset": str(files / dataset),
        "max_steps": 8,
        "max_length": 48,
        "per_device_train_batch_size": 4,
        "learning_rate": 1e-3,
    }
    return UserTaskOptions(**{**values, **changes})


def test_rows_of_varied_length_are_padded_per_batch_and_run_plain_packing_group_by_length(files, tmp_path):
    task = build_user_task(_options(files, "mixed.csv", prompt_column="prompt"))
    assert isinstance(task.data_collator, PadToLongest) and task.info["padding_share"] > 0.1
    assert all(labels[0] == -100 for labels in task.train["labels"])  # the prompt is not scored
    assert parse_method("packing").declines(task) is None
    argv = ["bench", "--model_name_or_path", str(files / "model"), "--dataset", str(files / "mixed.csv")]
    argv += ["--prompt_column", "prompt", "--max_length", "48", "--max_steps", "8", "--learning_rate", "1e-3"]
    argv += ["--per_device_train_batch_size", "4", "--lr_multipliers", "1", "--widen", "0"]
    argv += ["--methods", "plain", "packing", "group_by_length", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["task"]["prompt_column"] == "prompt" and data["task"]["lengths"]["max"] == 48
    assert "token" in data["calibration"]["step_seconds"]
    for method in ("plain", "packing", "group_by_length"):
        runs = [r for r in data["runs"] if r["method"] == method and r.get("eval_loss") is not None]
        assert runs and all(
            math.isfinite(r["eval_loss"]) and set(r["step_counts"]) == {"token"} for r in runs
        )
    assert {v["method"] for v in data["verdicts"]} >= {"plain", "packing", "group_by_length"}


def test_texts_of_one_length_have_nothing_to_gain(files):
    rows = build_user_task(_options(files, "same.csv", lm_examples="rows"))
    assert rows.info["padding_share"] == 0
    blocks = build_user_task(_options(files, "same.csv"))
    for task in (rows, blocks):
        for spec in ("packing", "packing-naive", "group_by_length"):
            assert parse_method(spec).declines(task).startswith("nothing to gain from packing")
    assert "--lm_examples rows" in parse_method("packing").declines(blocks)


def test_a_missing_prompt_column_or_rows_for_a_classifier_are_refused(files):
    with pytest.raises(DataError, match=r"`--prompt_column` 'question' is not a column of .*mixed.csv"):
        build_user_task(_options(files, "mixed.csv", prompt_column="question"))
    with pytest.raises(DataError, match=r"`--prompt_column` and `--lm_examples` are for `--task causal_lm`"):
        _options(files, "mixed.csv", task="sequence_classification", lm_examples="rows").check()
    with pytest.raises(DataError, match=r"`--lm_examples` must be one of \['blocks', 'rows'\], got 'lines'"):
        _options(files, "mixed.csv", lm_examples="lines").check()


def test_the_eval_groups_follow_the_rows_that_are_kept(files, tmp_path):
    from hf_hybrid.bench.instruct import docstring_pairs, unseen_files

    pairs = [(p, path.name) for path in unseen_files()[:3] for p in docstring_pairs(path, path.name)[:4]]
    rows = [[p.prompt.decode(), p.response.decode(), name] for p, name in pairs]
    rows.insert(5, ["a prompt longer than max_length " * 20, "never scored", "dropped.py"])
    with open(tmp_path / "eval.csv", "w", newline="") as f:
        csv.writer(f).writerows([["prompt", "text", "file"], *rows])
    options = _options(
        files,
        "mixed.csv",
        prompt_column="prompt",
        eval_dataset=str(tmp_path / "eval.csv"),
        eval_group_column="file",
    )
    task = build_user_task(options)
    assert len(task.evaluation) == len(pairs) == len(task.eval_clusters)  # the too-long prompt is dropped
    assert task.eval_clusters == [i // 4 for i in range(len(pairs))]
