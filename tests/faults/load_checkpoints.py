"""Resume every listed checkpoint in this (new) process and train one more step from it.

python load_checkpoints.py JOBS.json   ->  JOBS.result.json: [{test, checkpoint, error}], error None if it
resumed, trained one step and ended with finite weights and the engine's step count carried over.
Used by the fault suite's invariants fixture; one process serves all checkpoints of a test module.
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

from helpers import tiny_data  # noqa: E402
from transformers import GPT2LMHeadModel, TrainerCallback  # noqa: E402

from hf_hybrid import HybridHFTrainer, HybridTrainingArguments  # noqa: E402
from hf_hybrid.checkpoint import read_engine_entry  # noqa: E402
from hf_hybrid.engine.predictor import EMAPredictor, available_predictors, register_predictor  # noqa: E402


class _StopAfterOne(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = True


def _resume_one(folder: Path, frozen: list[str], workdir: str) -> None:
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
    trainer.add_callback(_StopAfterOne())
    step = int(folder.name.split("-")[-1])
    trainer.train(resume_from_checkpoint=str(folder))
    if trainer.state.global_step != step + 1:
        raise AssertionError(f"resumed at {trainer.state.global_step - 1}, expected {step}")
    for name, p in trainer.model.named_parameters():
        if not bool(torch.isfinite(p).all()):
            raise AssertionError(f"non-finite weight {name} after the resumed step")
    if read_engine_entry(folder) is not None and trainer.hybrid_stats()["steps"] != step + 1:
        raise AssertionError(f"engine restored {trainer.hybrid_stats()['steps'] - 1} steps, expected {step}")


def main() -> None:
    spec = Path(sys.argv[1])
    results = []
    for job in json.loads(spec.read_text()):
        error = None
        with tempfile.TemporaryDirectory() as workdir:
            try:
                _resume_one(Path(job["checkpoint"]), job["frozen"], workdir)
            except Exception:  # noqa: BLE001 - reported back to the test, with its traceback
                error = traceback.format_exc(limit=4)
        results.append({**job, "error": error})
    spec.with_suffix(".result.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
