"""The invariants every fault test must keep (used through the `invariants` fixture in conftest.py).

`invariants.watch(trainer)` before training; `invariants.verify()` after it (the fixture calls it at
teardown if the test did not). Checked:

* after every optimizer step: every trainable weight is finite; a PREDICT step left the optimizer
  state (moments, step counts) exactly as it was; the recovery action the step reports is the one it
  performed (rollback: counted, weights exactly back on the phase's snapshot, FULL forced; force_full,
  skip and restore: FULL forced, nothing rolled back; shorten_horizon: the horizon cap halved;
  continue: none of these); with the spike guard on, a step it skipped left every trainable weight and
  the optimizer state exactly as they were, and a restore put back exactly its trusted copy's weights and
  optimizer state;
* every action other than `continue` was logged once, at its step, as that action, and nothing else was;
* at the end: frozen weights bit-identical to their start (in the model and in every checkpoint);
  every checkpoint on disk holds only finite weights, hybrid tensors and optimizer state;
* every checkpoint resumes in a new process (one subprocess per test module, for all its tests'
  checkpoints, at module teardown) exactly where the uninterrupted run was: the weights and the
  optimizer state it loads are that run's after the checkpoint's step, bit for bit, and it trains on
  like that run, step after step (weights, optimizer state, the engine's timeline row and counters),
  up to the next step a fault was injected at (a new process has no fault hooks), at most
  `MAX_COMPARED` steps; then one more step at least, which must leave every weight finite.
"""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from harness import fault_steps, same_optimizer_state, step_record
from safetensors.torch import load_file
from transformers import Trainer, TrainerCallback

from hf_hybrid.checkpoint import HYBRID_STATE_FILE

LOADER = Path(__file__).parent / "load_checkpoints.py"
MAX_COMPARED = 20  # continued steps compared per checkpoint


def _finite_problems(tensors: dict[str, Any], where: str) -> list[str]:
    out = []
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            out.append(f"{where}: non-finite values in {name}")
    return out


def _optimizer_tensors(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)["state"]
    return {f"{i}.{k}": v for i, s in state.items() for k, v in s.items() if isinstance(v, torch.Tensor)}


class _ActionLog(logging.Handler):
    """Collects the engine's recovery log lines as (step, action)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.actions: Counter[tuple[int, str]] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, "hybrid_action"):
            self.actions[(record.hybrid_step, record.hybrid_action)] += 1


class _Watcher(TrainerCallback):
    def __init__(self, owner: Invariants, trainer: Trainer) -> None:
        self.owner = owner
        self.trainer = trainer
        self.before: dict[Any, Any] | None = None
        self.engine_before: dict[str, Any] = {}

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.before = copy.deepcopy(self.trainer.optimizer.state_dict()["state"])
        engine = getattr(self.trainer, "engine", None)
        if engine is not None:
            self.engine_before = {
                "stats": engine.stats(),
                "cap": engine.controller.horizon_cap,
                "snapshot": {n: t.clone() for n, t in engine.guard.snapshot.items()},
                "params": {n: p.detach().clone() for n, p in engine.params.items()},
                "guard": _guard_view(engine.spike_guard),
            }

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = state.global_step
        if getattr(self.trainer, "engine", None) is not None:
            self.owner.records[id(self.trainer)][step] = step_record(self.trainer)
        for name, p in self.trainer.model.named_parameters():
            if p.requires_grad and not bool(torch.isfinite(p).all()):
                self.owner.violations.append(f"step {step}: non-finite trainable weight {name}")
        timeline = getattr(self.trainer, "hybrid_timeline", None)
        if timeline and timeline[-1]["phase"] == "predict":
            self.owner.predict_steps_checked += 1
            if not same_optimizer_state(self.before, self.trainer.optimizer.state_dict()["state"]):
                self.owner.violations.append(f"step {step}: a PREDICT step changed the optimizer state")
        if timeline and self.engine_before:
            self.owner.violations += self._performed_problems(step, timeline[-1])
            if timeline[-1]["action"] != "continue":
                self.owner.performed[(len(timeline), timeline[-1]["action"])] += 1

    def _performed_problems(self, step: int, row: dict[str, Any]) -> list[str]:
        """Does the engine's state after the step show exactly the action the step reports?"""
        engine, before = self.trainer.engine, self.engine_before
        after = engine.stats()
        grew = {key: after[key] - before["stats"][key] for key in ("rollbacks", "forced_full")}
        action, where = row["action"], f"step {step} ({row['phase']}, action {row['action']})"
        self.owner.actions_checked[action] += 1
        expected = {
            "rollback": {"rollbacks": 1, "forced_full": 1},
            "force_full": {"rollbacks": 0, "forced_full": 1},
            "skip": {"rollbacks": 0, "forced_full": 1},
            "restore": {"rollbacks": 0, "forced_full": 1},
        }.get(action, {"rollbacks": 0, "forced_full": 0})
        problems = [f"{where}: {key} grew by {grew[key]}" for key in grew if grew[key] != expected[key]]
        if row["rolled_back"] != (action == "rollback"):
            problems.append(f"{where}: rolled_back={row['rolled_back']}")
        if action == "rollback":
            snapshot = before["snapshot"] or before["params"]  # a phase opened in this step starts here
            if any(not torch.equal(snapshot[n], p) for n, p in engine.params.items()):
                problems.append(f"{where}: the weights are not back on the phase's snapshot")
        problems += self._guard_problems(where, engine.spike_guard, action)
        if action == "shorten_horizon":
            halved = max(engine.config.schedule.min_predict_steps, before["cap"] // 2)
            if engine.controller.horizon_cap != halved:
                problems.append(f"{where}: horizon cap {before['cap']} -> {engine.controller.horizon_cap}")
        return problems

    def _guard_problems(self, where: str, guard: Any, action: str) -> list[str]:
        """A step the spike guard skipped changed nothing, unless a clean batch trained in its batch's place
        or its update was kept at the last kept rate (then the weights moved); a restore put back exactly
        the trusted copy."""
        before = self.engine_before["guard"]
        if before is None:
            return []
        problems = []
        state = self.trainer.optimizer.state_dict()["state"]
        if len(guard.skip_steps) > before["skips"]:
            self.owner.actions_checked["spike_skip"] += 1
            moved = any(not torch.equal(b, p) for b, p in zip(before["params"], guard.params, strict=True))
            if len(guard.scaled_back_steps) > before["scaled"]:  # an update kept at the last kept rate
                if not moved:
                    problems.append(
                        f"{where}: an update kept at the last kept rate left the weights as they were"
                    )
            elif len(guard.replay_steps) > before["replays"]:
                self.owner.actions_checked["spike_replay"] += 1
                if not moved:
                    problems.append(f"{where}: a step trained on a clean batch left the weights as they were")
            elif moved:
                problems.append(f"{where}: a skipped step changed the weights")
            elif not same_optimizer_state(self.before, state):
                problems.append(f"{where}: a skipped step changed the optimizer state")
        if action == "restore":
            self.owner.actions_checked["spike_restore"] += 1
            trusted = before["copies"][id(guard.trusted)]  # the copy put back is the trusted one now
            if any(not torch.equal(t, p) for t, p in zip(trusted["params"], guard.params, strict=True)):
                problems.append(f"{where}: the weights are not the trusted copy's")
            live = [self.trainer.optimizer.state.get(p, {}) for p in guard.params]
            if not same_optimizer_state(dict(enumerate(trusted["state"])), dict(enumerate(live))):
                problems.append(f"{where}: the optimizer state is not the trusted copy's")
        return problems


def _guard_view(guard: Any) -> dict[str, Any] | None:
    """The spike guard's skips so far, the weights it guards and its two copies, by store (a restore puts
    back the trusted one or a pending one from before the fault; None: the guard is off)."""
    if not guard.params:
        return None
    return {
        "skips": len(guard.skip_steps),
        "replays": len(guard.replay_steps),
        "scaled": len(guard.scaled_back_steps),
        "params": [p.detach().clone() for p in guard.params],
        "copies": {
            id(store): {"params": [t.clone() for t in store.params], "state": copy.deepcopy(store.state)}
            for store in (guard.trusted, guard.pending)
        },
    }


class Invariants:
    def __init__(self, loader: CheckpointLoader, test_id: str) -> None:
        self.loader = loader
        self.test_id = test_id
        self.trainers: list[Trainer] = []
        self.frozen_start: list[dict[str, torch.Tensor]] = []
        self.violations: list[str] = []
        self.predict_steps_checked = 0
        self.actions_checked: Counter[str] = Counter()
        self.performed: Counter[tuple[int, str]] = Counter()  # (step, action) of the watched steps
        self.action_log = _ActionLog()
        self.verified = False
        self.records: dict[int, dict[int, dict[str, Any]]] = {}  # per trainer: step -> step_record
        self.references: dict[int, Trainer] = {}  # per trainer: the uninterrupted run it continues

    def watch(self, trainer: Trainer, reference: Trainer | None = None) -> Trainer:
        """Check `trainer`; `reference`: the uninterrupted run that `trainer` continues (and the run its
        output folder's checkpoints come from), when not `trainer` itself."""
        self.trainers.append(trainer)
        self.records[id(trainer)] = {}
        self.references[id(trainer)] = reference or trainer
        self.frozen_start.append(
            {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
        )
        trainer.add_callback(_Watcher(self, trainer))
        engine_logger = logging.getLogger("hf_hybrid.engine.engine")
        if self.action_log not in engine_logger.handlers:
            engine_logger.addHandler(self.action_log)
            engine_logger.setLevel(logging.DEBUG)
        return trainer

    def checkpoints(self) -> list[Path]:
        folders: set[Path] = set()
        for trainer in self.trainers:
            folders.update(Path(trainer.args.output_dir).glob("checkpoint-*"))
        return sorted(folders)

    def verify(self) -> None:
        """Assert every invariant; then queue the complete checkpoints for the new-process check."""
        self.verified = True
        engine_logger = logging.getLogger("hf_hybrid.engine.engine")
        engine_logger.removeHandler(self.action_log)
        engine_logger.setLevel(logging.NOTSET)
        problems = list(self.violations)
        if self.performed != self.action_log.actions:
            problems.append(
                f"logged actions {dict(self.action_log.actions)} != performed {dict(self.performed)}"
            )
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
                self.loader.add(self.test_id, folder, sorted(frozen_all), **self._expected(folder))

    def _expected(self, folder: Path) -> dict[str, Any]:
        """What resuming `folder` must give: the uninterrupted run's record of the checkpoint's step and of
        the unfaulted steps after it (empty when no watched run recorded that step)."""
        step = int(folder.name.split("-")[-1])
        for trainer in self.trainers:
            reference = self.references[id(trainer)]
            records = self.records[id(reference)]
            if Path(trainer.args.output_dir) != folder.parent or step not in records:
                continue
            faulted = fault_steps(reference)
            after: list[dict[str, Any]] = []
            # record k is what step k (1-based) left; that step ran as 0-based step k - 1
            while len(after) < MAX_COMPARED and step + len(after) + 1 in records:
                if step + len(after) in faulted:
                    break
                after.append(records[step + len(after) + 1])
            return {"loaded": records[step], "after": after}
        return {"loaded": None, "after": []}

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
        self.compared: dict[str, int] = {}  # checkpoint -> continued steps compared with the reference

    def add(
        self,
        test_id: str,
        folder: Path,
        frozen: list[str],
        loaded: dict[str, Any] | None = None,
        after: list[dict[str, Any]] | None = None,
    ) -> None:
        """`loaded`/`after`: the uninterrupted run's `step_record` of the checkpoint's step and of the
        steps after it, which the resumed run must reproduce."""
        job = {"test": test_id, "checkpoint": str(folder), "frozen": frozen}
        self.jobs.append({**job, "loaded": loaded, "after": after or []})

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
        self.compared = {r["checkpoint"]: r["compared"] for r in results}
        failed = [f"{r['test']}: {r['checkpoint']}: {r['error']}" for r in results if r["error"]]
        assert len(results) == len(self.jobs)
        assert not failed, "checkpoints that did not resume in a new process:\n" + "\n".join(failed)
