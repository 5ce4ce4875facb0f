"""The invariants every fault test must keep (used through the `invariants` fixture in conftest.py).

`invariants.watch(trainer)` before training; `invariants.verify()` after it (the fixture calls it at
teardown if the test did not). Checked:

* after every optimizer step: every trainable weight is finite; a PREDICT step left the optimizer
  state (moments, step counts) exactly as it was;
* at the end: frozen weights bit-identical to their start (in the model and in every checkpoint);
  every checkpoint on disk holds only finite weights, hybrid tensors and optimizer state;
* every checkpoint resumes in a new process and trains one more step there (one subprocess per test
  module, for all its tests' checkpoints, at module teardown).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from harness import same_optimizer_state
from safetensors.torch import load_file
from transformers import Trainer, TrainerCallback

from hf_hybrid.checkpoint import HYBRID_STATE_FILE

LOADER = Path(__file__).parent / "load_checkpoints.py"


def _finite_problems(tensors: dict[str, Any], where: str) -> list[str]:
    out = []
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            out.append(f"{where}: non-finite values in {name}")
    return out


def _optimizer_tensors(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)["state"]
    return {f"{i}.{k}": v for i, s in state.items() for k, v in s.items() if isinstance(v, torch.Tensor)}


class _Watcher(TrainerCallback):
    def __init__(self, owner: Invariants, trainer: Trainer) -> None:
        self.owner = owner
        self.trainer = trainer
        self.before: dict[Any, Any] | None = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.before = copy.deepcopy(self.trainer.optimizer.state_dict()["state"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        for name, p in self.trainer.model.named_parameters():
            if p.requires_grad and not bool(torch.isfinite(p).all()):
                self.owner.violations.append(f"step {step}: non-finite trainable weight {name}")
        timeline = getattr(self.trainer, "hybrid_timeline", None)
        if timeline and timeline[-1]["phase"] == "predict":
            self.owner.predict_steps_checked += 1
            if not same_optimizer_state(self.before, self.trainer.optimizer.state_dict()["state"]):
                self.owner.violations.append(f"step {step}: a PREDICT step changed the optimizer state")


class Invariants:
    def __init__(self, loader: CheckpointLoader, test_id: str) -> None:
        self.loader = loader
        self.test_id = test_id
        self.trainers: list[Trainer] = []
        self.frozen_start: list[dict[str, torch.Tensor]] = []
        self.violations: list[str] = []
        self.predict_steps_checked = 0
        self.verified = False

    def watch(self, trainer: Trainer) -> Trainer:
        self.trainers.append(trainer)
        self.frozen_start.append(
            {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
        )
        trainer.add_callback(_Watcher(self, trainer))
        return trainer

    def checkpoints(self) -> list[Path]:
        folders: set[Path] = set()
        for trainer in self.trainers:
            folders.update(Path(trainer.args.output_dir).glob("checkpoint-*"))
        return sorted(folders)

    def verify(self) -> None:
        """Assert every invariant; then queue the complete checkpoints for the new-process check."""
        self.verified = True
        problems = list(self.violations)
        for trainer, frozen in zip(self.trainers, self.frozen_start, strict=True):
            params = dict(trainer.model.named_parameters())
            problems += [
                f"frozen weight {n} moved" for n, v in frozen.items() if not torch.equal(params[n], v)
            ]
            problems += _finite_problems({n: p.detach() for n, p in params.items()}, "final model")
        frozen_all = {n: v for frozen in self.frozen_start for n, v in frozen.items()}
        for folder in self.checkpoints():
            problems += self._check_folder(folder, frozen_all)
        assert not problems, "\n".join(problems[:20])
        for folder in self.checkpoints():
            if (folder / "trainer_state.json").is_file():
                self.loader.add(self.test_id, folder, sorted(frozen_all))

    @staticmethod
    def _check_folder(folder: Path, frozen: dict[str, torch.Tensor]) -> list[str]:
        problems = []
        weights = folder / "model.safetensors"
        if not weights.is_file():
            return [f"{folder.name}: no model.safetensors"]
        tensors = load_file(str(weights))
        problems += _finite_problems(tensors, f"{folder.name}/model.safetensors")
        for name, start in frozen.items():
            if name in tensors and not torch.equal(tensors[name], start.cpu()):
                problems.append(f"{folder.name}: frozen weight {name} differs from its start")
        if (folder / HYBRID_STATE_FILE).is_file():
            problems += _finite_problems(load_file(str(folder / HYBRID_STATE_FILE)), f"{folder.name}/hybrid")
        if (folder / "optimizer.pt").is_file():
            problems += _finite_problems(
                _optimizer_tensors(folder / "optimizer.pt"), f"{folder.name}/optimizer"
            )
        return problems


class CheckpointLoader:
    """Collects complete checkpoints; resumes each in one new process at module teardown."""

    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = []

    def add(self, test_id: str, folder: Path, frozen: list[str]) -> None:
        self.jobs.append({"test": test_id, "checkpoint": str(folder), "frozen": frozen})

    def run(self, workdir: Path) -> None:
        if not self.jobs:
            return
        spec = workdir / "jobs.json"
        spec.write_text(json.dumps(self.jobs))
        proc = subprocess.run(
            [sys.executable, str(LOADER), str(spec)], capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        results = json.loads((workdir / "jobs.result.json").read_text())
        failed = [f"{r['test']}: {r['checkpoint']}: {r['error']}" for r in results if r["error"]]
        assert len(results) == len(self.jobs)
        assert not failed, "checkpoints that did not resume in a new process:\n" + "\n".join(failed)
