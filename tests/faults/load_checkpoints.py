"""Resume every listed checkpoint in this (new) process and train on from it, as the uninterrupted run did.

python load_checkpoints.py JOBS.json   ->  JOBS.result.json: [{test, checkpoint, ..., error, compared}],
error None if it resumed exactly where the uninterrupted run was (`loaded`: that run's `step_record` after
the checkpoint's step, compared before the first resumed step), trained the job's `after` steps exactly
as that run did (one at least), and ended with finite weights and the engine's step count carried over;
`compared`: how many steps were compared. Used by the fault suite's invariants fixture; one process
serves all checkpoints of a test module.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

torch.set_num_threads(1)

from harness import state_digests, step_record  # noqa: E402
from helpers import tiny_data  # noqa: E402
from transformers import GPT2LMHeadModel, TrainerCallback  # noqa: E402

from hf_hybrid import HybridHFTrainer, HybridTrainingArguments  # noqa: E402
from hf_hybrid.checkpoint import read_engine_entry  # noqa: E402
from hf_hybrid.engine.predictor import EMAPredictor, available_predictors, register_predictor  # noqa: E402


class _Replay(TrainerCallback):
    """Records the state the resumed run starts from and what each of its steps leaves; stops after
    `steps` steps."""

    def __init__(self, trainer, steps: int) -> None:
        self.trainer = trainer
        self.steps = steps
        self.loaded: dict | None = None
        self.records: list[dict] = []

    def on_step_begin(self, args, state, control, **kwargs):
        if self.loaded is None:
            engine_record = step_record(self.trainer) if self.trainer.hybrid_timeline else {}
            self.loaded = {**engine_record, **state_digests(self.trainer)}

    def on_step_end(self, args, state, control, **kwargs):
        self.records.append(step_record(self.trainer))
        if len(self.records) >= self.steps:
            control.should_training_stop = True


def _same(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN equals NaN here


def _differences(got: dict, want: dict, prefix: str = "") -> list[str]:
    """The keys whose values differ, a nested dict's by its own keys (`stats.max_confidence`)."""
    out = []
    for key in sorted(set(got) | set(want)):
        a, b = got.get(key), want.get(key)
        if _same({key: a}, {key: b}):
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def _resume_one(folder: Path, frozen: list[str], workdir: str, loaded: dict | None, after: list[dict]) -> int:
    saved = torch.load(folder / "training_args.bin", weights_only=False)
    predictor = getattr(saved, "hybrid_predictor", "ema")
    if predictor not in available_predictors():  # a test's fault predictor: the EMA predictor under its name
        register_predictor(predictor, type(f"Loaded_{predictor}", (EMAPredictor,), {"name": predictor}))
    values = saved.to_dict()
    values.update(output_dir=workdir, save_strategy="no", report_to="none", logging_steps=1)
    args = HybridTrainingArguments(**values)
    model = GPT2LMHeadModel.from_pretrained(str(folder))
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    train, _ = tiny_data()
    trainer = HybridHFTrainer(model=model, args=args, train_dataset=train)
    replay = _Replay(trainer, max(1, len(after)))
    trainer.callback_handler.callbacks.insert(0, replay)  # sees the loaded state before any other hook
    step = int(folder.name.split("-")[-1])
    trainer.train(resume_from_checkpoint=str(folder))
    if trainer.state.global_step != step + replay.steps:
        raise AssertionError(f"resumed at {trainer.state.global_step - replay.steps}, expected {step}")
    if loaded is not None and not _same(replay.loaded, loaded):
        raise AssertionError(
            f"resumed from step {step} with {_differences(replay.loaded, loaded)} other than the "
            "uninterrupted run's at that step"
        )
    for i, (got, want) in enumerate(zip(replay.records, after, strict=False)):
        if not _same(got, want):
            raise AssertionError(
                f"resumed step {step + i + 1}: {_differences(got, want)} differ from the uninterrupted run "
                f"(resumed {got.get('row')}, uninterrupted {want.get('row')})"
            )
    for name, p in trainer.model.named_parameters():
        if not bool(torch.isfinite(p).all()):
            raise AssertionError(f"non-finite weight {name} after the resumed step")
    if read_engine_entry(folder) is not None and trainer.hybrid_stats()["steps"] != step + replay.steps:
        restored = trainer.hybrid_stats()["steps"] - replay.steps
        raise AssertionError(f"engine restored {restored} steps, expected {step}")
    return len(after)


def main() -> None:
    spec = Path(sys.argv[1])
    results = []
    for job in json.loads(spec.read_text()):
        error, compared = None, 0
        with tempfile.TemporaryDirectory() as workdir:
            try:
                compared = _resume_one(
                    Path(job["checkpoint"]), job["frozen"], workdir, job.get("loaded"), job.get("after", [])
                )
            except Exception:  # noqa: BLE001 - reported back to the test, with its traceback
                error = traceback.format_exc(limit=4)
        results.append(
            {"test": job["test"], "checkpoint": job["checkpoint"], "error": error, "compared": compared}
        )
    spec.with_suffix(".result.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
