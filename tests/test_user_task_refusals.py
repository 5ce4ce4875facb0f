"""`hf-hybrid bench` on the user's own model and data refuses what docs/bench.md says it refuses, naming
the flag, the value and what is allowed, before anything trains.

Each refusal is checked where it is made (`UserTaskOptions.check` / `build_user_task`) and once through the
command line (one error line, exit code 2). Next to each refusal, the nearest input that is accepted, so a
check that refuses everything would fail here too.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from hf_hybrid.bench.user_task import UserTaskOptions, build_user_task
from hf_hybrid.cli import main
from hf_hybrid.data import DataError

TEXTS = {
    "email": ["From: a@example.org", "Subject: hello", "Reply-To: b@example.org", "MIME-Version: 1.0"],
    "http": ["GET /index.html HTTP/1.1", "Host: example.org", "HTTP/1.1 404 Not Found", "Accept: */*"],
    "xml": ["<a><b/></a>", "<?xml version='1.0'?>", "<root attr='1'/>", "<x>text</x>"],
}


def _write_csv(path: Path, rows: list[tuple[str, str]]) -> str:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "y"])
        writer.writerows(rows)
    return str(path)


def _rows(labels: dict[str, list[str]], repeat: int = 2) -> list[tuple[str, str]]:
    return [(text, label) for _ in range(repeat) for label, texts in labels.items() for text in texts]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A saved tiny BERT classifier (MiniLM's tokenizer), CSVs with string labels, and folders that are
    not a model."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from hf_hybrid.bench.tasks import minilm_path

    root = tmp_path_factory.mktemp("user")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    BertForSequenceClassification(config).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "tokenizer_only")  # a folder with files, but no config.json
    (root / "empty_folder").mkdir()
    return {
        "root": root,
        "model": str(root / "model"),
        "train": _write_csv(root / "train.csv", _rows(TEXTS)),
        "one_label": _write_csv(root / "one_label.csv", _rows({"email": TEXTS["email"]}, repeat=3)),
        "eval_seen": _write_csv(root / "eval_seen.csv", _rows({k: v[:2] for k, v in TEXTS.items()}, 1)),
        "eval_unseen": _write_csv(
            root / "eval_unseen.csv",
            _rows({"email": TEXTS["email"][:2], "smtp": ["HELO example.org", "MAIL FROM:<a@b>"]}, 1),
        ),
    }


def _options(files, **changes) -> UserTaskOptions:
    values = {
        "model_name_or_path": files["model"],
        "dataset": files["train"],
        "task": "sequence_classification",
        "label_column": "y",
        "max_steps": 4,
        "max_length": 16,
        "per_device_train_batch_size": 4,
    }
    return UserTaskOptions(**{**values, **changes})


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if anything trains."""
    from transformers import Trainer

    def refuse(*args, **kwargs):
        raise AssertionError("trained before the bad input was refused")

    monkeypatch.setattr(Trainer, "train", refuse)


def test_the_accepted_task_builds(files, tmp_path):
    task = build_user_task(_options(files))
    assert task.info["labels"] == ["email", "http", "xml"]
    assert len(task.train) + len(task.evaluation) == 24 and set(task.train["labels"]) <= {0, 1, 2}
    task = build_user_task(_options(files, eval_dataset=files["eval_seen"]))
    assert len(task.train) == 24 and task.evaluation["labels"] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("folder", ["tokenizer_only", "empty_folder"])
def test_a_model_folder_without_config_json_is_refused(files, tmp_path, no_training, folder):
    path = str(files["root"] / folder)
    with pytest.raises(
        DataError, match=rf"`--model_name_or_path` {path} has no config.json: not a saved model"
    ):
        _options(files, model_name_or_path=path).check()
    with pytest.raises(DataError, match="has no config.json"):
        build_user_task(_options(files, model_name_or_path=path))


def test_fewer_than_two_labels_are_refused(files, tmp_path, no_training):
    with pytest.raises(DataError, match=r"`--label_column` 'y' has 1 distinct label\(s\); need >= 2"):
        build_user_task(_options(files, dataset=files["one_label"]))


def test_fewer_than_two_labels_are_refused_in_a_saved_dataset_too(files, tmp_path, no_training):
    """A `save_to_disk` folder whose label column is a `ClassLabel` of one name: a one-label classifier
    is a regression head in transformers, not a classifier."""
    from datasets import ClassLabel, Dataset, Features, Value

    features = Features({"text": Value("string"), "y": ClassLabel(names=["email"])})
    folder = tmp_path / "one_class_label"
    Dataset.from_dict({"text": TEXTS["email"] * 3, "y": [0] * 12}, features=features).save_to_disk(
        str(folder)
    )
    with pytest.raises(DataError, match=r"`--label_column` 'y' has 1 distinct label\(s\); need >= 2"):
        build_user_task(_options(files, dataset=str(folder)))


def test_an_eval_label_never_seen_in_training_is_refused(files, tmp_path, no_training):
    message = r"labels \['smtp'\] of the eval split are not in the training labels \['email', 'http', 'xml'\]"
    with pytest.raises(DataError, match=message):
        build_user_task(_options(files, eval_dataset=files["eval_unseen"]))


def test_saved_datasets_whose_label_names_differ_are_matched_by_name(files, tmp_path, no_training):
    """Two `save_to_disk` sets whose `ClassLabel`s number the same names differently: the eval labels are
    read by name (numbers would swap them silently), and a name the training set lacks is refused."""
    from datasets import ClassLabel, Dataset, Features, Value

    def saved(name: str, names: list[str], labels: list[int]) -> str:
        features = Features({"text": Value("string"), "y": ClassLabel(names=names)})
        texts = [TEXTS["email"][0]] * len(labels)
        Dataset.from_dict({"text": texts, "y": labels}, features=features).save_to_disk(str(tmp_path / name))
        return str(tmp_path / name)

    train = saved("train", ["neg", "pos"], [0, 1] * 6)
    flipped = saved("flipped", ["pos", "neg"], [0, 0, 1])  # pos, pos, neg
    task = build_user_task(_options(files, dataset=train, eval_dataset=flipped))
    assert task.evaluation["labels"] == [1, 1, 0]
    other = saved("other", ["neg", "pos", "meh"], [0, 2])
    with pytest.raises(DataError, match=r"labels \['meh'\] of the eval split are not in the training labels"):
        build_user_task(_options(files, dataset=train, eval_dataset=other))


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_eval_fraction_must_be_inside_zero_one(files, no_training, fraction):
    with pytest.raises(DataError, match=rf"`--eval_fraction` must be in \(0, 1\), got {fraction}"):
        _options(files, eval_fraction=fraction).check()


@pytest.mark.parametrize(("fraction", "held_out"), [(0.05, 2), (0.5, 12), (0.75, 18)])
def test_eval_fractions_inside_zero_one_are_accepted(files, tmp_path, fraction, held_out):
    task = build_user_task(_options(files, eval_fraction=fraction))
    assert (len(task.evaluation), len(task.train)) == (held_out, 24 - held_out)  # ceil(fraction x 24)


@pytest.mark.parametrize("rate", [0.0, -1e-4, math.nan, -math.inf])
def test_the_learning_rate_must_be_positive(files, no_training, rate):
    with pytest.raises(DataError, match=rf"`--learning_rate` must be > 0, got {rate}"):
        _options(files, learning_rate=rate).check()


def test_a_positive_learning_rate_is_the_sweeps_base_rate(files, tmp_path):
    _options(files, learning_rate=1e-9).check()
    assert build_user_task(_options(files, learning_rate=3e-4)).learning_rate == 3e-4
    assert build_user_task(_options(files)).learning_rate is None  # the arena's range test sets it


@pytest.mark.parametrize("peft", ["qlora", "LoRA", "", "true"])
def test_peft_must_be_none_or_lora(files, no_training, peft):
    with pytest.raises(DataError, match=rf"`--peft` must be one of \['none', 'lora'\], got '{peft}'"):
        _options(files, peft=peft).check()


def _bench(files, tmp_path, capsys, *flags: str) -> tuple[int, str]:
    argv = ["bench", "--model_name_or_path", files["model"], "--dataset", files["train"]]
    argv += ["--task", "sequence_classification", "--label_column", "y", "--max_steps", "8"]
    argv += ["--methods", "plain", "--seeds", "0", "--out", str(tmp_path / "out"), *flags]
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--model_name_or_path", "TOKENIZER_ONLY"), "has no config.json: not a saved model"),
        (("--dataset", "ONE_LABEL"), "`--label_column` 'y' has 1 distinct label(s); need >= 2"),
        (
            ("--eval_dataset", "EVAL_UNSEEN"),
            "labels ['smtp'] of the eval split are not in the training labels",
        ),
        (("--eval_fraction", "1"), "`--eval_fraction` must be in (0, 1), got 1.0"),
        (("--eval_fraction", "0"), "`--eval_fraction` must be in (0, 1), got 0.0"),
        (("--learning_rate", "0"), "`--learning_rate` must be > 0, got 0.0"),
        (("--learning_rate=-1e-3",), "`--learning_rate` must be > 0, got -0.001"),
    ],
)
def test_the_command_line_says_what_to_change_and_exits_2(
    files, tmp_path, capsys, no_training, flags, message
):
    paths = {
        "TOKENIZER_ONLY": str(files["root"] / "tokenizer_only"),
        "ONE_LABEL": files["one_label"],
        "EVAL_UNSEEN": files["eval_unseen"],
    }
    code, err = _bench(files, tmp_path, capsys, *(paths.get(f, f) for f in flags))
    errors = [line for line in err.splitlines() if line.startswith("hf-hybrid bench: error: ")]
    assert code == 2 and len(errors) == 1 and message in errors[0], err
    assert not (tmp_path / "out" / "results.json").exists()


def test_the_command_line_refuses_an_unknown_peft_naming_the_choices(files, tmp_path, capsys, no_training):
    with pytest.raises(SystemExit) as exc:
        _bench(files, tmp_path, capsys, "--peft", "qlora")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "hf-hybrid bench: error: argument --peft: invalid choice: 'qlora' (choose from " in err
    assert err.rstrip().endswith(("'none', 'lora')", "none, lora)")), err
