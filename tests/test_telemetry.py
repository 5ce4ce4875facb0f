"""Telemetry users can see: hybrid/* metrics in the logs and the real W&B run file, the tqdm postfix,
the phase-timeline plot (on disk and on the W&B run)."""

from __future__ import annotations

import json
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from helpers import hybrid_trainer, step_logs
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from hf_hybrid.telemetry import (
    TIMELINE_PLOT_FILE,
    WANDB_IMAGE_KEY,
    measured_time_saved_fraction,
    phase_segments,
    plot_timeline,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The telemetry the design promises (docs/usage.md, "Metrics"), as log keys: phase, steps per phase,
# backward passes skipped (count and fraction), predicted vs actual loss, residual norms, update cosine,
# confidence, horizon, rollbacks, divergence level, predictor bytes, estimated compute saved.
DESIGN_KEYS = {
    "phase",
    "steps_warmup",
    "steps_full",
    "steps_predict",
    "steps_correct",
    "backward_skipped",
    "backward_skipped_fraction",
    "predicted_loss",
    "measured_loss",
    "residual_norm",
    "residual_rel_norm",
    "update_cosine",
    "confidence",
    "horizon",
    "rollbacks",
    "divergence_level",
    "predictor_bytes",
    "compute_saved_fraction",
}
PHASE_INDEX = {"warmup": 0, "full": 1, "predict": 2, "correct": 3}


def read_wandb_records(path: Path) -> list[Any]:
    """Decode a W&B run file: leveldb-log blocks (32 KiB, 7-byte headers, crc32 of type+data) of
    length-prefixed `wandb_internal_pb2.Record` messages, after a 7-byte file header (`:W&B`)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, _magic, version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and version == 0, (ident, version)
    block, header = 32768, 7
    pos, pending, payloads = 7, b"", []
    while pos + header <= len(data):
        left = block - pos % block
        if left < header:  # block trailer: too small for a header, zero padding
            pos += left
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        if (checksum, length, kind) == (0, 0, 0):  # zero padding up to the end of the block
            pos += left
            continue
        if pos + header + length > len(data):  # the writer is mid-record: stop at the last whole one
            break
        chunk = data[pos + header : pos + header + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == checksum, f"bad crc at {pos}"
        pos += header + length
        if kind == 1:  # FULL
            payloads.append(chunk)
        elif kind == 2:  # FIRST
            pending = chunk
        elif kind == 3:  # MIDDLE
            pending += chunk
        elif kind == 4:  # LAST
            payloads.append(pending + chunk)
            pending = b""
        else:
            raise AssertionError(f"unknown record type {kind} at {pos}")
    records = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def finished_run_records(path: Path, wait_s: float = 120.0) -> list[Any]:
    """The run's records once its `exit` record (always the last one) is on disk.

    `wandb.finish()` in offline mode can return before wandb-core has flushed the run file (seen: only
    the 7-byte header right after finish, the whole run a moment later), so wait for the exit record.
    """
    deadline = time.monotonic() + wait_s
    while True:
        records = read_wandb_records(path)
        if records and records[-1].WhichOneof("record_type") == "exit":
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} has no exit record after {wait_s} s: {len(records)} records")
        time.sleep(0.2)


def wandb_history(path: Path) -> list[dict[str, Any]]:
    """Every history row of the run, keys joined with '.' for nested values (e.g. an image's `_type`)."""
    rows = []
    for record in finished_run_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    (item.key or ".".join(item.nested_key)): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def counts_up_to(timeline: list[dict[str, Any]], step: int) -> dict[str, int]:
    rows = [row for row in timeline if row["step"] <= step]
    return {phase: sum(row["phase"] == phase for row in rows) for phase in PHASE_INDEX}


def test_hybrid_metrics_reach_the_logs_and_the_wandb_run_file(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "hf-hybrid-tests")
    trainer = hybrid_trainer(tmp_path / "out", report_to="wandb", max_steps=30, logging_steps=5)
    try:
        trainer.train()
    finally:
        wandb.finish()

    # 1. trainer_state's log history: every promised metric at every training log, with values that
    # agree with the per-step timeline the trainer recorded independently.
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["step"] for e in logs] == [5, 10, 15, 20, 25, 30]
    assert trainer.hybrid_stats()["backward_skipped"] > 0, "the run must contain predicted steps"
    for entry in logs:
        keys = {key.removeprefix("hybrid/") for key in entry if key.startswith("hybrid/")}
        missing = DESIGN_KEYS - keys
        # residuals and the update cosine exist once a predicted update has been scored against a real one
        if entry["step"] <= 10:
            missing -= {"residual_norm", "residual_rel_norm", "update_cosine"}
        assert not missing, (entry["step"], missing)
        counts = counts_up_to(trainer.hybrid_timeline, entry["step"])
        for phase, count in counts.items():
            assert entry[f"hybrid/steps_{phase}"] == count, (entry["step"], phase)
        assert entry["hybrid/backward_skipped"] == counts["predict"]
        assert entry["hybrid/backward_skipped_fraction"] == pytest.approx(counts["predict"] / entry["step"])
        row = next(r for r in trainer.hybrid_timeline if r["step"] == entry["step"])
        assert entry["hybrid/phase"] == PHASE_INDEX[row["phase"]]
        assert entry["hybrid/measured_loss"] == pytest.approx(row["loss"])
        assert entry["hybrid/rollbacks"] == sum(
            r["rolled_back"] for r in trainer.hybrid_timeline[: entry["step"]]
        )

    # 2. the W&B run file on disk: the same keys, under train/, at the same train/global_step
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    history = wandb_history(run_file)
    by_step = {row["train/global_step"]: row for row in history if "train/loss" in row}
    assert sorted(by_step) == [e["step"] for e in logs]
    for entry in logs:
        row = by_step[entry["step"]]
        hybrid = {key: value for key, value in entry.items() if key.startswith("hybrid/")}
        assert {f"train/{key}": value for key, value in hybrid.items()} == {
            key: value
            for key, value in row.items()
            if key.startswith("train/hybrid/") and key != WANDB_IMAGE_KEY
        }

    # 3. the phase-timeline plot: a PNG in output_dir, and an image record on the run at the last step
    plot = tmp_path / "out" / TIMELINE_PLOT_FILE
    assert plot.read_bytes()[:8] == PNG_SIGNATURE
    images = [row for row in history if row.get(f"{WANDB_IMAGE_KEY}._type") == "image-file"]
    assert len(images) == 1
    assert images[0]["train/global_step"] == 30
    media = run_file.parent / "files" / images[0][f"{WANDB_IMAGE_KEY}.path"]
    assert media.read_bytes() == plot.read_bytes()


class _PostfixRecorder(TrainerCallback):
    """Reads the training bar's postfix after every step (runs after the trainer's own callbacks)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.seen: list[tuple[int, str, str]] = []

    def on_step_end(self, args, state, control, **kwargs):
        (bar,) = [
            c.training_bar for c in self.trainer.callback_handler.callbacks if isinstance(c, ProgressCallback)
        ]
        timeline = self.trainer.hybrid_timeline
        skipped = sum(row["phase"] == "predict" for row in timeline) / len(timeline)
        expected = f"phase={timeline[-1]['phase']}, skipped={skipped:.0%}"
        self.seen.append((state.global_step, bar.postfix, expected))


def test_progress_bar_shows_phase_and_skipped_share(tmp_path):
    trainer = hybrid_trainer(tmp_path, disable_tqdm=False, max_steps=25, logging_steps=100)
    recorder = _PostfixRecorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    assert len(recorder.seen) == 25
    for step, postfix, expected in recorder.seen:
        assert postfix == expected, step
    assert any("phase=predict" in postfix for _, postfix, _ in recorder.seen)
    assert recorder.seen[-1][1].endswith(f"skipped={trainer.hybrid_stats()['backward_skipped_fraction']:.0%}")
    assert trainer.hybrid_stats()["backward_skipped"] > 0


def test_timeline_plot_written_only_for_hybrid_runs(tmp_path):
    hybrid = hybrid_trainer(tmp_path / "hybrid", max_steps=15)
    hybrid.train()
    plot = tmp_path / "hybrid" / TIMELINE_PLOT_FILE
    assert plot.read_bytes()[:8] == PNG_SIGNATURE
    from matplotlib.image import imread

    assert imread(plot).shape[:2] == (400, 1000)
    plain = hybrid_trainer(tmp_path / "plain", max_steps=5, hybrid_enabled=False)
    plain.train()
    assert not (tmp_path / "plain" / TIMELINE_PLOT_FILE).exists()


def test_phase_segments_and_plot_of_a_timeline_with_rollbacks(tmp_path):
    phases = ["warmup"] * 3 + ["full"] * 2 + ["predict"] * 3 + ["correct", "full"]
    timeline = [
        {
            "step": i + 1,
            "phase": p,
            "loss": 3.0 - 0.1 * i,
            "predicted_loss": None if i == 0 else 3.05 - 0.1 * i,
            "rolled_back": i == 8,
            "level": 0,
        }
        for i, p in enumerate(phases)
    ]
    assert phase_segments(timeline) == [
        ("warmup", 1, 3),
        ("full", 4, 5),
        ("predict", 6, 8),
        ("correct", 9, 9),
        ("full", 10, 10),
    ]
    path = plot_timeline(timeline, tmp_path / "sub" / "t.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with pytest.raises(ValueError, match="timeline"):
        plot_timeline([], tmp_path / "empty.png")


def test_measured_time_saved_fraction():
    rows = [{"phase": "full", "seconds": 1.0}] * 3 + [{"phase": "predict", "seconds": 0.5}]
    assert measured_time_saved_fraction(rows) == pytest.approx(1 - 3.5 / 4.0)
    assert measured_time_saved_fraction([{"phase": "predict", "seconds": 0.5}]) is None
    assert measured_time_saved_fraction([{"phase": "full"}]) is None


def test_training_logs_only_carry_hybrid_keys_from_the_engine(tmp_path):
    trainer = hybrid_trainer(tmp_path, max_steps=12, logging_steps=4)
    trainer.train()
    assert step_logs(trainer, "hybrid/steps_warmup") == [4.0, 8.0, 10.0]
    final = trainer.state.log_history[-1]  # the end-of-run metrics carry the run's hybrid summary
    assert "train_runtime" in final
    assert {key for key in final if key.startswith("hybrid/")} == {
        "hybrid/backward_skipped_fraction", "hybrid/rollbacks", "hybrid/predict_phases",
        "hybrid/max_confidence", "hybrid/engine_peak_bytes", "hybrid/engine_time_share",
    }  # fmt: skip
    assert all(isinstance(v, float) for k, v in final.items() if k.startswith("hybrid/"))
