"""The spike guard in the trainer: a clean run is the plain Trainer's, a bad batch is skipped and changes
nothing, an outsized update is taken back exactly, damaged weights are restored to the trusted copy
exactly, every action is loud, it resumes."""

from __future__ import annotations

import logging
import re
import shutil
import types
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import common_args, counters, hybrid_trainer, lora_gpt2, plain_trainer, step_logs, tiny_data
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from hf_hybrid import HybridHFTrainer, HybridTrainingArguments
from hf_hybrid.bench.measure.faults import FaultWindow, inject
from hf_hybrid.engine.phases import PhaseSchedule
from hf_hybrid.engine.spike_guard import SpikeGuard
from hf_hybrid.model_card import card_context, render_section
from hf_hybrid.telemetry import run_summary

# copies every 5 steps (the spacing by size: `test_large_copies_are_spaced_by_their_size`)
GUARD = {
    "hybrid_confidence_threshold": 1.0,
    "hybrid_spike_guard": "on",
    "hybrid_guard_every": 5,
}
LOSS_ONLY = {"hybrid_guard_max_update_ratio": 0.0}  # no update check: a burst is the loss's to catch
BURST = FaultWindow("lr_burst", 50, 3)  # steps 51-53 (1-based)
BURST_FACTOR = 300.0  # the bench's x30 is a blip on this tiny model, gone the next step: left alone
GARBAGE = FaultWindow("garbage", 50, 2)  # random tokens in steps 51 and 52


def _trainable(trainer: Any) -> list[torch.nn.Parameter]:
    return [p for p in trainer.model.parameters() if p.requires_grad]


def _state(trainer: Any) -> dict[str, Any]:
    """The trainable weights, every optimizer-state entry of each, and the scheduler's step count."""
    optimizer = trainer.optimizer
    params = _trainable(trainer)
    return {
        "weights": [p.detach().clone() for p in params],
        "optimizer": [
            {
                k: v.detach().clone() if torch.is_tensor(v) else v
                for k, v in optimizer.state.get(p, {}).items()
            }
            for p in params
        ],
        "schedule": trainer.lr_scheduler.last_epoch,
        "next_lrs": [group["lr"] for group in optimizer.param_groups],  # after the step: the next step's
        "trusted": trainer.engine.spike_guard.trusted.step if isinstance(trainer, HybridHFTrainer) else None,
    }


def _equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Weights and optimizer state bit-identical (every tensor, every value)."""
    if not all(torch.equal(x, y) for x, y in zip(a["weights"], b["weights"], strict=True)):
        return False
    for x, y in zip(a["optimizer"], b["optimizer"], strict=True):
        if x.keys() != y.keys():
            return False
        for key in x:
            same = torch.equal(x[key], y[key]) if torch.is_tensor(x[key]) else x[key] == y[key]
            if not same:
                return False
    return True


class Snapshots(TrainerCallback):
    """The state after every optimizer step (`at[step]`, 1-based)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.at: dict[int, dict[str, Any]] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.at[state.global_step] = _state(self.trainer)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.at[state.global_step] = _state(self.trainer)


class Burst(TrainerCallback):
    """The learning rate x`BURST_FACTOR` in the window's steps (the scheduler resets it next step)."""

    def on_step_begin(
        self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any
    ) -> None:
        if BURST.covers(state.global_step):
            for group in optimizer.param_groups:
                group["lr"] *= BURST_FACTOR


def _faulted(trainer: Any, fault: FaultWindow) -> Any:
    if fault is BURST:
        trainer.add_callback(Burst())
    else:
        inject(trainer, fault, seed=0)
    return trainer


def _watched(trainer: Any, fault: FaultWindow | None = None) -> Snapshots:
    snapshots = Snapshots(trainer)
    trainer.add_callback(snapshots)
    if fault is not None:
        _faulted(trainer, fault)
    return snapshots


def _actions(trainer: Any, action: str) -> list[int]:
    return [row["step"] for row in trainer.hybrid_timeline if row["action"] == action]


def _lora_on_a_trained_base(tmp_path: Path) -> torch.nn.Module:
    """LoRA on the tiny GPT-2 after 100 plain steps: on a random base an adapter learns nothing, and
    random tokens are no worse than its outputs."""
    from peft import LoraConfig, get_peft_model

    base = plain_trainer(tmp_path / "base", max_steps=100)
    base.train()
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM"
    )
    torch.manual_seed(0)
    return get_peft_model(base.model, config)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    theirs = dict(b.named_parameters())
    return all(torch.equal(p, theirs[name]) for name, p in a.named_parameters())


def test_a_clean_run_with_the_guard_is_the_plain_trainer(tmp_path, capsys):
    plain = plain_trainer(tmp_path / "plain", max_steps=60)
    plain.train()
    hybrid = hybrid_trainer(tmp_path / "hybrid", max_steps=60, **GUARD)
    hybrid.train()
    stats = hybrid.hybrid_stats()
    assert stats["spike_guard"] and stats["restores"] == 0 and stats["skips"] == 0
    assert stats["spike_skipped_steps"] == 0 and stats["spike_guard_storage"] == "host"
    weights = sum(p.numel() * 4 for p in hybrid.model.parameters())
    assert (
        stats["update_check"] and stats["updates_taken_back"] == 0 and 0 < stats["largest_update_ratio"] < 10
    )
    # two copies of the weights and Adam's moments, and the update check's copy of the weights
    assert stats["spike_guard_bytes"] >= 2 * 3 * weights + weights
    assert step_logs(plain, "loss") == step_logs(hybrid, "loss")
    assert _same_weights(plain.model, hybrid.model)
    started = [line for line in capsys.readouterr().out.splitlines() if "spike guard on" in line]
    assert len(started) == 1 and "MiB of host memory" in started[0], started


def test_large_copies_are_spaced_by_their_size(tmp_path, capsys):
    """`hybrid_guard_spacing_mb` reaches the guard: copies over it are spaced x2 per doubling of their
    size (x16 at most), said at the start; the spacing is in the stats."""
    args = {**GUARD, "hybrid_guard_spacing_mb": 0.01}  # the tiny model's copy (0.3 MiB) is ~30x that
    hybrid = hybrid_trainer(tmp_path, max_steps=40, **args)
    hybrid.train()
    every = hybrid.hybrid_stats()["spike_guard_copy_every"]
    assert every == 16 * GUARD["hybrid_guard_every"] == hybrid.guard_plan.copy_every
    said = [line for line in capsys.readouterr().out.splitlines() if "spike guard on" in line]
    assert len(said) == 1 and "every 80 steps" in said[0], said


def _fed_again(trainer: Any, at: int, source: int) -> Any:
    """The plain loop's step `at` (0-based) trains on the micro-batch of step `source` again."""
    kept: dict[str, Any] = {}
    original = trainer.training_step

    def training_step(self: Any, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        if self.state.global_step == source:
            kept["batch"] = (inputs, num_items_in_batch)
        if self.state.global_step == at:
            inputs, num_items_in_batch = kept["batch"]
        return original(model, inputs, num_items_in_batch)

    trainer.training_step = types.MethodType(training_step, trainer)
    return trainer


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_blamed_batch_s_step_trains_on_the_last_clean_batch(tmp_path, lora, caplog):
    """Random tokens in steps 51-52: each batch is blamed (as bad at the trusted weights). The first is
    under twice the level on this barely trained model, so it is left alone as a hard batch would be;
    the second in a row is a run of bad batches: its batch is skipped and the step trains on the newest
    clean batch, step 50's, again. The run is the plain Trainer's whose step 52 was fed step 50's batch,
    bit for bit (dropout included: the replay draws what the step would have drawn), to the last step."""
    models = [_lora_on_a_trained_base(tmp_path / f"base{i}") if lora else None for i in range(2)]
    trainer = hybrid_trainer(tmp_path / "run", model=models[0], max_steps=60, **GUARD)
    snapshots = _watched(trainer, GARBAGE)
    with caplog.at_level(logging.WARNING, logger="hf_hybrid"):
        trainer.train()
    stats = trainer.hybrid_stats()
    assert _actions(trainer, "skip") == [52] == stats["skip_steps"] == stats["replay_steps"]
    assert stats["blamed_data"] == 2 and stats["restores"] == 0 and stats["replays"] == 1
    assert not _equal(snapshots.at[51], snapshots.at[50])  # the first bad batch: left alone
    assert snapshots.at[52]["schedule"] == snapshots.at[51]["schedule"] + 1
    plain = plain_trainer(tmp_path / "plain", model=models[1], max_steps=60)
    inject(plain, FaultWindow("garbage", 50, 1), seed=0)  # the same random tokens in step 51
    _fed_again(plain, at=51, source=49)
    plain_snapshots = _watched(plain)
    plain.train()
    assert _equal(snapshots.at[52], plain_snapshots.at[52]) and _equal(
        snapshots.at[60], plain_snapshots.at[60]
    )
    warned = [r.message for r in caplog.records if r.levelno == logging.WARNING and ": skip: " in r.message]
    assert len(warned) == 1 and "trained the step on the clean batches of step 50" in warned[0], warned


def _moved(before: dict[str, Any], after: dict[str, Any]) -> list[torch.Tensor]:
    return [b - a for a, b in zip(before["weights"], after["weights"], strict=True)]


@pytest.mark.parametrize("optim", ["adamw_torch", "adamw_bnb_8bit"])
def test_an_outsized_update_is_kept_at_the_last_kept_rate(tmp_path, optim, caplog):
    """The burst's updates are hundreds of times the recent ones and raise their own batch's loss: each is
    taken back and redone at the last kept update's rate. The update is linear in the rate and the
    optimizer's state (the 8-bit one's included) is the same at any rate, so step 51 moves the weights
    by the plain Trainer's step 51 (same state, same batch) x step 50's rate / step 51's; said as a skip,
    step by step."""
    if optim == "adamw_bnb_8bit":
        pytest.importorskip("bitsandbytes")
    trainer = hybrid_trainer(tmp_path, max_steps=60, optim=optim, **GUARD)
    snapshots = _watched(trainer, BURST)
    with caplog.at_level(logging.WARNING, logger="hf_hybrid"):
        trainer.train()
    stats = trainer.hybrid_stats()
    assert stats["taken_back_steps"] == [51, 52, 53] == _actions(trainer, "skip") == stats["skip_steps"]
    assert stats["scaled_back_steps"] == [51, 52, 53] and stats["spike_skipped_steps"] == 0
    assert stats["restores"] == 0
    plain = plain_trainer(tmp_path / "plain", max_steps=60, optim=optim)
    plain_snapshots = _watched(plain)
    plain.train()
    assert _equal(snapshots.at[50], plain_snapshots.at[50])
    kept_over_now = plain_snapshots.at[49]["next_lrs"][0] / plain_snapshots.at[50]["next_lrs"][0]
    for guarded, unguarded in zip(
        _moved(snapshots.at[50], snapshots.at[51]),
        _moved(plain_snapshots.at[50], plain_snapshots.at[51]),
        strict=True,
    ):
        assert torch.allclose(guarded, unguarded * kept_over_now, rtol=1e-3, atol=1e-7)
    usual = torch.cat([m.flatten() for m in _moved(snapshots.at[49], snapshots.at[50])]).norm()
    for step in (51, 52, 53):
        before, after = snapshots.at[step - 1], snapshots.at[step]
        moved = torch.cat([m.flatten() for m in _moved(before, after)]).norm()
        assert 0.5 * usual < moved < 2 * usual, (step, moved, usual)  # a step of the usual size, not 300x
        assert after["schedule"] == before["schedule"] + 1
    warned = [
        r.message for r in caplog.records if r.levelno == logging.WARNING and "outsized update" in r.message
    ]
    assert len(warned) == 3 and all(": skip: " in m for m in warned), warned
    assert all("kept the applied update at the last kept update's learning rate" in m for m in warned), warned
    final = [e for e in trainer.state.log_history if "hybrid/updates_taken_back" in e][-1]
    assert final["hybrid/updates_taken_back"] == 3
    summary = run_summary(stats)
    assert "3 outsized updates taken back at step 51, 52, 53, 3 of them kept at the last kept rate" in summary
    context = card_context(stats, trainer.engine.metrics(), trainer.hybrid_args.hybrid_dict(), [])
    row = "| 3 (at step 51, 52, 53); 3 of them kept at the last kept rate |"
    assert f"| spike guard: outsized updates taken back {row}" in render_section(context)


@pytest.mark.parametrize("optim", ["adamw_torch", "adamw_bnb_8bit"])
def test_a_restore_puts_back_the_trusted_copy_exactly(tmp_path, optim):
    """An lr x300 burst damages the weights (the update check off: as where its copy is too dear); after
    the guard's patience they and every optimizer-state tensor (the 8-bit optimizer's quantised moments
    and their scales included) equal the state at the trusted copy's step, and the schedule still
    follows the step count."""
    if optim == "adamw_bnb_8bit":
        pytest.importorskip("bitsandbytes")
    trainer = hybrid_trainer(tmp_path, max_steps=70, optim=optim, **GUARD, **LOSS_ONLY)
    snapshots = _watched(trainer, BURST)
    trainer.train()
    (restored,) = _actions(trainer, "restore")
    trusted = snapshots.at[restored - 1]["trusted"]
    assert trusted is not None and trusted < 51
    assert _equal(snapshots.at[restored], snapshots.at[trusted])
    assert not _equal(snapshots.at[restored - 1], snapshots.at[trusted])  # the burst had moved them
    assert snapshots.at[restored]["schedule"] == restored
    if optim == "adamw_bnb_8bit":
        dtypes = {
            v.dtype
            for state in snapshots.at[trusted]["optimizer"]
            for v in state.values()
            if torch.is_tensor(v)
        }
        assert torch.uint8 in dtypes, "no 8-bit state: the test would not cover the quantised moments"
    stats = trainer.hybrid_stats()
    assert stats["restore_steps"] == [restored] and stats["spike_skipped_steps"] == restored - trusted


@pytest.mark.gpu
def test_a_restore_under_a_grad_scaler_puts_back_the_trusted_copy(tmp_path):
    """fp16 on CUDA: the GradScaler sees every step (nothing is skipped), a burst is still restored."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    trainer = hybrid_trainer(tmp_path, max_steps=70, fp16=True, use_cpu=False, **GUARD, **LOSS_ONLY)
    snapshots = _watched(trainer, BURST)
    trainer.train()
    assert trainer.accelerator.scaler is not None
    (restored,) = _actions(trainer, "restore")
    trusted = snapshots.at[restored - 1]["trusted"]
    assert _equal(snapshots.at[restored], snapshots.at[trusted])


def test_every_action_is_loud(tmp_path, caplog):
    """A restore and a skip each: a warning, a hybrid/* metric, a timeline mark, the end-of-run summary
    and the model card; restores counted once. (A taken-back update is a skip: the test above.)"""
    trainer = hybrid_trainer(tmp_path, max_steps=80, **GUARD, **LOSS_ONLY)
    _faulted(trainer, BURST)
    inject(trainer, FaultWindow("garbage", 70, 2), seed=0)  # the second of two is skipped
    with caplog.at_level(logging.WARNING, logger="hf_hybrid"):
        trainer.train()
    stats = trainer.hybrid_stats()
    assert stats["restores"] == 1 and stats["skips"] >= 1
    assert _actions(trainer, "restore") == stats["restore_steps"]
    assert _actions(trainer, "skip") == stats["skip_steps"] and 72 in stats["skip_steps"]
    warned = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        sum(": restore: " in m for m in warned) == 1
        and sum(": skip: " in m for m in warned) == stats["skips"]
    )
    final = [e for e in trainer.state.log_history if "hybrid/restores" in e][-1]
    assert final["hybrid/restores"] == 1 and final["hybrid/skips"] == stats["skips"]
    summary = run_summary(stats)
    assert f"1 restore at step {stats['restore_steps'][0]}" in summary and "bad batch" in summary
    context = card_context(stats, trainer.engine.metrics(), trainer.hybrid_args.hybrid_dict(), [])
    section = render_section(context)
    assert (
        f"| spike guard: restores / bad batches skipped | 1 (at step {stats['restore_steps'][0]})" in section
    )


def test_the_tested_path_is_the_shipped_path(tmp_path, monkeypatch):
    """Every public method of `SpikeGuard` that decides or acts is called by a trainer run with faults:
    a decision path that only tests drive (as `after_step` once was) fails here."""
    called: set[str] = set()
    accessors = {"stats", "state_dict", "load_state_dict", "tensors", "nbytes", "buffer_count"}
    public = [
        name for name in vars(SpikeGuard) if not name.startswith("_") and callable(vars(SpikeGuard)[name])
    ]
    for name in public:
        original = getattr(SpikeGuard, name)

        def spy(self: SpikeGuard, *args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            called.add(_name)
            return _original(self, *args, **kw)

        monkeypatch.setattr(SpikeGuard, name, spy)
    for check, acted in (({}, "updates_taken_back"), (LOSS_ONLY, "restores")):
        args = {**GUARD, **check, "save_strategy": "steps", "save_steps": 40}
        trainer = hybrid_trainer(tmp_path / acted, max_steps=80, **args)
        _faulted(trainer, BURST)
        inject(trainer, FaultWindow("garbage", 70, 2), seed=0)  # the second of two is skipped
        trainer.train()
        assert trainer.hybrid_stats()[acted] >= 1 and trainer.hybrid_stats()["skips"] >= 1
    assert set(public) - accessors <= called, sorted(set(public) - accessors - called)


@pytest.mark.parametrize(
    ("check", "acted", "saved"),
    [({}, "taken_back_steps", 40), (LOSS_ONLY, "restore_steps", 40), ({}, "taken_back_steps", 3)],
    ids=["take-back", "restore", "before-the-first-copy"],
)
def test_the_guard_resumes_and_restores_what_the_uninterrupted_run_does(tmp_path, check, acted, saved):
    """A checkpoint at step 40 (or at step 3, before the first copy), the burst after it: the resumed run
    takes back or restores at the same steps to the same state and ends with the same weights and every
    decision and counter, to the last bit (no copy is in the checkpoint: saving rebases the copies
    on the saved state, which the resumed run copies again; the update check's recent norms are in it)."""
    args = {**GUARD, **check, "max_steps": 70, "save_strategy": "steps", "save_steps": saved}
    whole = hybrid_trainer(tmp_path / "whole", **args)
    _faulted(whole, BURST)
    whole.train()
    assert whole.hybrid_stats()[acted] != []
    resumed = hybrid_trainer(tmp_path / "whole", **args)
    _faulted(resumed, BURST)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / f"checkpoint-{saved}"))
    decided = [
        {k: v for k, v in counters(run.hybrid_stats()).items() if "engine_" not in k}
        for run in (resumed, whole)
    ]
    assert decided[0] == decided[1]  # the engine's bytes are as last counted: at another step after a resume
    assert _same_weights(resumed.model, whole.model)


def test_a_resumed_run_trains_blamed_steps_on_the_batches_the_uninterrupted_run_does(tmp_path):
    """A checkpoint at step 45, random tokens in steps 51-57: the steps blamed after the first train on
    the batches of steps 50 down to 45 (newest first); step 45's only the checkpoint holds (one file per
    rank). The resumed run ends with the uninterrupted run's weights and every decision, bit for bit."""
    args = {**GUARD, "max_steps": 60, "save_strategy": "steps", "save_steps": 45}
    garbage = FaultWindow("garbage", 50, 7)
    whole = hybrid_trainer(tmp_path / "whole", **args)
    inject(whole, garbage, seed=0)
    whole.train()
    assert whole.hybrid_stats()["replay_steps"] == [52, 53, 54, 55, 56, 57]
    checkpoint = tmp_path / "whole" / "checkpoint-45"
    assert (checkpoint / "hybrid_clean_batches_rank0.pt").is_file()
    resumed = hybrid_trainer(tmp_path / "whole", **args)
    inject(resumed, garbage, seed=0)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    decided = [
        {k: v for k, v in counters(run.hybrid_stats()).items() if "engine_" not in k}
        for run in (resumed, whole)
    ]
    assert decided[0] == decided[1] and _same_weights(resumed.model, whole.model)


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def test_the_guard_adds_at_most_a_tenth_to_a_checkpoint(tmp_path):
    """At the library's defaults, what the guard adds to a checkpoint (its window and counters; no copy)
    is at most 10% of the plain Trainer's checkpoint. (On this 30k-parameter model the engine's own
    JSON is itself ~15% of it; on MiniLM both are well under 1%: benchmarks/README.md.)"""
    plain = plain_trainer(tmp_path / "plain", max_steps=30, save_strategy="steps", save_steps=30)
    plain.train()
    defaults = {f"hybrid_{k}": v for k, v in asdict(PhaseSchedule()).items() if k != "script"}
    sizes = {}
    for guard in ("auto", "off"):
        run = hybrid_trainer(
            tmp_path / guard,
            max_steps=30,
            save_strategy="steps",
            save_steps=30,
            hybrid_spike_guard=guard,
            **defaults,
        )
        run.train()
        sizes[guard] = _folder_bytes(tmp_path / guard / "checkpoint-30")
        assert run.hybrid_stats()["spike_guard"] == (guard == "auto")
    added, theirs = sizes["auto"] - sizes["off"], _folder_bytes(tmp_path / "plain" / "checkpoint-30")
    assert 0 < added <= 0.1 * theirs, (added, theirs)


def test_checkpoint_storage_restores_the_saved_checkpoint(tmp_path):
    """No copy in memory: a restore reads the trusted checkpoint (weights and optimizer), which the save
    at step 50, one before the burst, left trusted: it is on disk, not dropped as a memory copy is."""
    args = {**GUARD, "hybrid_guard_storage": "checkpoint", "save_strategy": "steps", "save_steps": 10}
    trainer = hybrid_trainer(tmp_path, max_steps=70, **args)
    snapshots = _watched(trainer, BURST)
    trainer.train()
    stats = trainer.hybrid_stats()
    assert stats["spike_guard_storage"] == "checkpoint" and stats["spike_guard_bytes"] == 0
    (restored,) = _actions(trainer, "restore")
    assert _equal(snapshots.at[restored], snapshots.at[40])


def test_a_vanished_checkpoint_falls_back_to_skipping_and_says_so(tmp_path, caplog):
    args = {**GUARD, "hybrid_guard_storage": "checkpoint", "save_strategy": "steps", "save_steps": 40}
    trainer = hybrid_trainer(tmp_path, max_steps=70, **args)
    _faulted(trainer, BURST)

    class Vanish(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 45:
                shutil.rmtree(tmp_path / "checkpoint-40")

    trainer.add_callback(Vanish())
    with caplog.at_level(logging.WARNING, logger="hf_hybrid"):
        trainer.train()
    assert trainer.hybrid_stats()["restores"] == 0
    assert any(
        "checkpoint-40 is gone" in r.message and "falls back to skipping" in r.message for r in caplog.records
    )


def test_a_budget_too_small_for_a_copy_falls_back_and_says_which(tmp_path, capsys, caplog):
    weights = sum(p.numel() * 4 for p in hybrid_trainer(tmp_path / "probe").model.parameters())
    room_for_weights = 2.5 * weights / 2**20  # two weight copies fit, two with Adam's moments do not
    fits = hybrid_trainer(tmp_path / "weights", max_steps=2, **GUARD, hybrid_guard_memory_mb=room_for_weights)
    fits.train()
    assert fits.hybrid_stats()["spike_guard_storage"] == "weights"
    assert "auto -> weights: host copies" in capsys.readouterr().out
    auto = {**GUARD, "hybrid_spike_guard": "auto", "hybrid_guard_memory_mb": 0.0}
    none = hybrid_trainer(tmp_path / "none", max_steps=2, **auto)
    with caplog.at_level(logging.WARNING, logger="hf_hybrid"):
        none.train()
    assert not none.hybrid_stats()["spike_guard"]
    assert any(
        "spike guard off" in r.message and "no checkpoint is saved" in r.message for r in caplog.records
    )
    on = hybrid_trainer(tmp_path / "on", max_steps=2, **{**auto, "hybrid_spike_guard": "on"})
    on.train()
    assert on.hybrid_stats()["spike_guard_storage"] == "none"


def test_the_guard_is_on_by_default_and_says_so_at_default_verbosity(tmp_path, capsys):
    """No guard flag: full and adapter runs are guarded (`auto`), and the start of training says, on the
    console a user sees without raising any verbosity, where the copies live, how they are spaced and the
    host memory they take. `off` turns it off."""
    default = hybrid_trainer(tmp_path / "default", max_steps=2)
    default.train()
    lora = hybrid_trainer(tmp_path / "lora", model=lora_gpt2(), max_steps=2)
    lora.train()
    assert default.args.hybrid_spike_guard == "auto"
    assert default.hybrid_stats()["spike_guard"] and lora.hybrid_stats()["spike_guard"]
    said = [line for line in capsys.readouterr().out.splitlines() if "spike guard on" in line]
    assert len(said) == 2, said
    assert re.search(
        r"copies in host; one copy \(\d+\.\d MiB\) every 10 steps: \d+\.\d MiB of host memory", said[0]
    )
    off = hybrid_trainer(tmp_path / "off", max_steps=2, hybrid_spike_guard="off")
    off.train()
    assert not off.hybrid_stats()["spike_guard"]


class HandMadeBurst(TrainerCallback):
    """A user's own lr logic gone wrong: the param groups' rate x30 for steps 21-23 (1-based)."""

    def on_step_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any):
        if 20 <= state.global_step < 23:
            for group in optimizer.param_groups:
                group["lr"] *= 30


def _tiny_llama(pretrained: dict[str, torch.Tensor] | None = None) -> LlamaForCausalLM:
    torch.manual_seed(0)
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=256, num_key_value_heads=2, max_position_embeddings=32, **sizes)
    )
    if pretrained is not None:
        model.load_state_dict(pretrained)
    return model


def test_a_40_step_fine_tune_with_a_hand_made_lr_burst_is_not_worse_guarded(tmp_path):
    """Issue 49's case, tiny: a 40-step fine-tune of a (briefly pretrained) tiny Llama, batch 8, lr 3e-3
    with the linear schedule, the rate x30 for steps 21-23 by a callback editing the param groups. With
    no guard flag (the default, `auto`) the run ends no worse than the plain Trainer's, here by far: the
    burst's updates are taken back when the rate comes down (they had been 19x the recent ones)."""
    train, evaluation = tiny_data()
    base_args = TrainingArguments(**common_args(tmp_path / "base", max_steps=100))
    base = Trainer(model=_tiny_llama(), args=base_args, train_dataset=train)
    base.train()
    pretrained = {k: v.clone() for k, v in base.model.state_dict().items()}
    args = common_args(tmp_path / "run", lr_scheduler_type="linear")  # 40 steps, batch 8, lr 3e-3

    def final_eval(trainer: Trainer, burst: bool) -> float:
        if burst:
            trainer.add_callback(HandMadeBurst())
        trainer.train()
        return trainer.evaluate(evaluation)["eval_loss"]

    def plain() -> Trainer:
        return Trainer(model=_tiny_llama(pretrained), args=TrainingArguments(**args), train_dataset=train)

    clean, burst = final_eval(plain(), False), final_eval(plain(), True)
    guarded = HybridHFTrainer(
        model=_tiny_llama(pretrained), args=HybridTrainingArguments(**args), train_dataset=train
    )
    damage = final_eval(guarded, True) - clean
    assert guarded.hybrid_stats()["spike_guard"] and burst - clean > 0.05
    assert damage <= burst - clean and damage < 0.25 * (burst - clean), (damage, burst - clean)
    assert guarded.hybrid_stats()["taken_back_steps"] == [21, 22, 23, 24]


def test_a_default_run_says_at_its_start_where_the_guard_s_copies_live(tmp_path, capsys):
    """No hybrid_* argument given: the guard is on (`auto`) and its start line is on the console at the
    default verbosity, as a user sees it."""
    trainer = hybrid_trainer(tmp_path, max_steps=2)
    assert trainer.args.hybrid_spike_guard == "auto"
    trainer.train()
    started = [line for line in capsys.readouterr().out.splitlines() if "spike guard on" in line]
    assert len(started) == 1 and "host memory" in started[0], started


def _untrained(batches: Any) -> None:
    raise AssertionError("nothing is trained here")


def test_kept_batches_that_cannot_be_saved_or_read_back_are_said_and_nothing_fails(tmp_path, caplog):
    """Inputs holding more than tensors and lists (objects of the user's collator): one pickle cannot take
    is not saved, one weights-only loading refuses is not loaded; each is a warning, and the run resumed
    from that checkpoint starts with no kept batch (its blamed steps skipped until it keeps some)."""
    from fractions import Fraction

    from hf_hybrid.clean_batches import RecentCleanBatches

    for tag, said in ((lambda: None, "are not in"), (Fraction(1, 3), "cannot be read back")):
        folder = tmp_path / said.replace(" ", "_")
        folder.mkdir()
        kept = RecentCleanBatches(
            lambda t=tag: [({"input_ids": torch.ones(2, 3), "tag": t}, None)], _untrained
        )
        kept.keep(5)
        again = RecentCleanBatches(lambda: [], _untrained)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hf_hybrid"):
            kept.save(folder, rank=0)
            again.load(folder, rank=0, device="cpu")
        assert len(again.kept) == 0 and again.train_on(1) is None
        assert any(said in r.message for r in caplog.records), [r.message for r in caplog.records]
