"""The hybrid state travels with HF checkpoints; a resumed run continues exactly."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from helpers import EveryStep, SaveAt, counters, hybrid_trainer, step_logs
from transformers import TrainerCallback

from hf_hybrid.checkpoint import (
    HYBRID_STATE_FILE,
    HYBRID_STATE_JSON,
    HybridCheckpointError,
    file_sha256,
    read_json,
    write_json,
)


def _params(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def _assert_refused_before_any_step(trainer, checkpoint, match):
    """The README's promise: a checkpoint the engine cannot use is refused before any step is taken,
    not even a forward pass."""
    forwards, steps = [], []
    trainer.model.register_forward_hook(lambda *args: forwards.append(1))
    trainer.add_callback(EveryStep(trainer, lambda tr: steps.append(tr.state.global_step)))
    with pytest.raises(HybridCheckpointError, match=match):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert forwards == [] and steps == []  # (global_step may be the checkpoint's: its state was read)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    trainer = hybrid_trainer(out, max_steps=40, save_strategy="steps", save_steps=10_000)
    saver = SaveAt(trainer)
    trainer.add_callback(saver)
    trainer.train()
    assert set(saver.saved) == {"mid_predict", "correct"}
    return out, trainer, saver.saved


@pytest.mark.parametrize("kind", ["mid_predict", "correct"])
def test_resume_continues_exactly(straight_run, tmp_path, kind):
    out, straight, saved = straight_run
    step = saved[kind]
    # restored whether or not HF is asked to restore callback states
    resumed = hybrid_trainer(
        out, max_steps=40, save_strategy="no", restore_callback_states_from_checkpoint=kind == "correct"
    )
    resumed.train(resume_from_checkpoint=str(out / f"checkpoint-{step}"))
    assert [r["phase"] for r in resumed.hybrid_timeline] == [r["phase"] for r in straight.hybrid_timeline]
    assert step_logs(resumed, "loss")[-(40 - step) :] == step_logs(straight, "loss")[-(40 - step) :]
    expected = _params(straight)
    for name, value in _params(resumed).items():
        assert torch.equal(value, expected[name]), name
    assert counters(resumed.hybrid_stats()) == counters(straight.hybrid_stats())


def test_a_checkpoint_saved_uncompressed_resumes_exactly(straight_run, tmp_path):
    """Older versions wrote `hybrid_state.json` and `hybrid_timeline.json` as plain JSON; such a
    checkpoint still resumes to the uninterrupted run's weights and phases."""
    import shutil

    out, straight, saved = straight_run
    step = saved["mid_predict"]
    folder = tmp_path / "run" / f"checkpoint-{step}"
    shutil.copytree(out / f"checkpoint-{step}", folder)
    for name in (HYBRID_STATE_JSON, "hybrid_timeline.json.gz"):
        (folder / name.removesuffix(".gz")).write_text(json.dumps(read_json(folder / name), indent=1))
        (folder / name).unlink()
    old_state = HYBRID_STATE_JSON.removesuffix(".gz")
    _edit_state(
        folder,
        edit_entry=lambda entry: entry.update(
            state_file=old_state, sha256={**entry["sha256"], "state": file_sha256(folder / old_state)}
        ),
    )
    resumed = hybrid_trainer(tmp_path / "run", max_steps=40, save_strategy="no")
    resumed.train(resume_from_checkpoint=str(folder))
    assert [r["phase"] for r in resumed.hybrid_timeline] == [r["phase"] for r in straight.hybrid_timeline]
    expected = _params(straight)
    assert all(torch.equal(value, expected[name]) for name, value in _params(resumed).items())


def test_the_checkpoint_holds_a_readable_hybrid_state(straight_run):
    out, straight, saved = straight_run
    folder = out / f"checkpoint-{saved['mid_predict']}"
    state = json.loads((folder / "trainer_state.json").read_text())
    entry = state["stateful_callbacks"]["HybridStateCallback"]["attributes"]["engine_state"]
    assert entry["format_version"] == 2
    assert entry["summary"]["predictor"] == "ema" and entry["summary"]["steps"] == saved["mid_predict"]
    tree = read_json(folder / HYBRID_STATE_JSON)
    assert tree["controller"]["phase"] == "predict"
    assert tree["controller"]["predict_remaining"] > 0
    assert tree["config"]["predictor"] == "ema"
    assert tree["guard"]["snapshot"]  # a phase is open, so its rollback point is saved
    assert tree["phase"]["predicted"] >= 1
    assert (folder / HYBRID_STATE_FILE).is_file()


def test_trainer_state_json_stays_small(straight_run):
    """Only the entry (versions, file names, checksums, headline numbers) is in trainer_state.json."""
    out, _, saved = straight_run
    folder = out / f"checkpoint-{saved['mid_predict']}"
    state = json.loads((folder / "trainer_state.json").read_text())
    entry = state["stateful_callbacks"]["HybridStateCallback"]["attributes"]["engine_state"]
    assert set(entry) == {"format_version", "tensor_file", "state_file", "sha256", "summary"}
    assert len(json.dumps(entry)) < 1024


def test_a_corrupt_tensor_file_is_refused_with_a_clear_message(straight_run, tmp_path):
    out, _, saved = straight_run
    import shutil

    folder = tmp_path / "checkpoint-x"
    shutil.copytree(out / f"checkpoint-{saved['correct']}", folder)
    data = (folder / HYBRID_STATE_FILE).read_bytes()
    (folder / HYBRID_STATE_FILE).write_bytes(data[: len(data) // 2])
    trainer = hybrid_trainer(tmp_path / "run", max_steps=40)
    _assert_refused_before_any_step(trainer, folder, "corrupt or truncated.*hybrid_restart_engine=True")


def test_a_changed_predictor_is_refused_and_restart_engine_accepts_it(straight_run, tmp_path, caplog):
    out, straight, saved = straight_run
    folder = str(out / f"checkpoint-{saved['correct']}")
    trainer = hybrid_trainer(tmp_path / "a", max_steps=40, hybrid_predictor="null")
    _assert_refused_before_any_step(
        trainer, folder, r"configuration differs.*'hybrid_predictor': \('ema', 'null'\)"
    )
    trainer = hybrid_trainer(
        tmp_path / "b", max_steps=40, hybrid_predictor="null", hybrid_restart_engine=True
    )
    with caplog.at_level("WARNING", logger="hf_hybrid"):
        trainer.train(resume_from_checkpoint=folder)
    assert trainer.state.global_step == 40
    # a new engine, not a new history: the counters and the timeline carry on from the checkpoint
    step = saved["correct"]
    assert trainer.hybrid_stats()["steps"] == 40 and len(trainer.hybrid_timeline) == 40
    assert [r["phase"] for r in trainer.hybrid_timeline[:step]] == [
        r["phase"] for r in straight.hybrid_timeline[:step]
    ]
    assert trainer.hybrid_timeline[step]["phase"] == "warmup"  # the new engine warms up again
    message = "\n".join(r.getMessage() for r in caplog.records)
    assert "a new engine from" in message and "start over, with a new warmup of 10 steps" in message
    assert "the counters, the engine's time and peak bytes, and the phase timeline carry on" in message
    # the engine's own time and peak bytes cover the whole run, as the timeline's step time does
    from hf_hybrid.checkpoint import rank_pair, read_engine_entry, read_engine_tree

    saved_tree = read_engine_tree(rank_pair(read_engine_entry(folder), 0), folder)
    assert trainer.engine.seconds > float(saved_tree["seconds"]) > 0
    assert trainer.hybrid_stats()["engine_peak_bytes"] >= sum(saved_tree["peak_memory"].values())


def _run_script(tmp_path, *args, check=True):
    import subprocess
    import sys
    from pathlib import Path

    result = tmp_path / f"result-{len(list(tmp_path.glob('result-*')))}.json"
    script = Path(__file__).parent / "programs" / "hybrid_run.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--result", str(result), *map(str, args)],
        capture_output=True,
        text=True,
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, (json.loads(result.read_text()) if result.exists() else None)


@pytest.mark.parametrize(
    "setup",
    [(), ("--lora", "--accumulation", "2", "--spike-guard", "on")],
    ids=["full", "lora_accumulation_guarded"],
)
def test_resume_in_a_new_process_continues_exactly(tmp_path, setup):
    out = tmp_path / "out"
    _, straight = _run_script(tmp_path, "--out", out, "--save-at-kinds", *setup)
    assert set(straight["saved_at"]) == {"mid_predict", "correct"}
    for kind, step in straight["saved_at"].items():
        # saved where the straight run saved after it (its kinds, and the Trainer's save at the end)
        later = [str(s) for s in straight["saved_at"].values() if s > step] + ["40"]
        resume = ("--resume", out / f"checkpoint-{step}", "--save-at-steps", *later)
        _, resumed = _run_script(tmp_path, "--out", out, *setup, *resume)
        assert resumed["phases"] == straight["phases"], kind
        assert len(resumed["losses"]) == 40
        assert resumed["losses"] == straight["losses"], kind
        assert resumed["params_sha256"] == straight["params_sha256"], kind
        assert counters(resumed["stats"]) == counters(straight["stats"]), kind


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_resumable(tmp_path, caplog):
    from hf_hybrid.checkpoint import last_complete_checkpoint

    out = tmp_path / "out"
    proc, _ = _run_script(
        tmp_path,
        "--out",
        out,
        "--max-steps",
        "30",
        "--save-every",
        "10",
        "--kill-in-save-at",
        "20",
        check=False,
    )
    assert proc.returncode == -9
    assert (out / "checkpoint-20" / HYBRID_STATE_FILE).exists()  # the kill landed mid-save
    assert not (out / "checkpoint-20" / "trainer_state.json").exists()
    with caplog.at_level("WARNING", logger="hf_hybrid.checkpoint"):
        assert last_complete_checkpoint(out) == str(out / "checkpoint-10")
    warning = caplog.records[-1].getMessage()
    assert "checkpoint-20 lacks trainer_state.json" in warning
    assert "resuming from checkpoint-10, so steps 11-20 will be trained again" in warning
    trainer = hybrid_trainer(out, max_steps=30, save_strategy="no")
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 30
    assert trainer.hybrid_stats()["steps"] == 30  # 10 restored from checkpoint-10, 20 trained now
    # and the run it continued is the uninterrupted one, to the last digit
    straight = hybrid_trainer(tmp_path / "straight", max_steps=30)
    straight.train()
    assert [r["phase"] for r in trainer.hybrid_timeline] == [r["phase"] for r in straight.hybrid_timeline]
    assert "predict" in [r["phase"] for r in straight.hybrid_timeline[10:]]  # the engine's state mattered
    assert (
        step_logs(trainer, "loss") == step_logs(straight, "loss") and len(step_logs(straight, "loss")) == 30
    )
    expected = _params(straight)
    for name, value in _params(trainer).items():
        assert torch.equal(value, expected[name]), name
    assert counters(trainer.hybrid_stats()) == counters(straight.hybrid_stats())


def test_plain_trainer_checkpoint_resumes_into_hybrid_with_a_fresh_engine(tmp_path, caplog):
    from helpers import plain_trainer

    plain = plain_trainer(tmp_path, max_steps=12, save_strategy="steps", save_steps=6)
    plain.train()
    hybrid = hybrid_trainer(tmp_path, max_steps=30, hybrid_warmup_steps=4)
    with caplog.at_level("WARNING", logger="hf_hybrid"):
        hybrid.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    assert "has no hybrid state" in caplog.text
    assert hybrid.state.global_step == 30
    assert hybrid.hybrid_stats()["steps"] == 24
    assert hybrid.hybrid_timeline[0]["phase"] == "warmup"


def test_hybrid_checkpoint_resumes_into_the_plain_trainer(straight_run, tmp_path):
    """The plain Trainer loads the checkpoint's weights as saved (mid predict phase) and continues exactly
    as from the same checkpoint with every hybrid file and entry removed: the hybrid state is ignored."""
    import shutil

    from safetensors.torch import load_file

    out, _, saved = straight_run
    step = saved["mid_predict"]
    checkpoint = out / f"checkpoint-{step}"
    stripped = tmp_path / f"stripped/checkpoint-{step}"
    shutil.copytree(checkpoint, stripped)
    for path in stripped.glob("hybrid_*"):
        path.unlink()
    state = json.loads((stripped / "trainer_state.json").read_text())
    del state["stateful_callbacks"]["HybridStateCallback"]
    (stripped / "trainer_state.json").write_text(json.dumps(state))

    hybrid_ckpt, loaded = _plain_resume(checkpoint, tmp_path / "from-hybrid")
    reference, _ = _plain_resume(stripped, tmp_path / "from-stripped")
    weights = load_file(str(checkpoint / "model.safetensors"))
    assert weights and all(torch.equal(loaded[name], value) for name, value in weights.items())
    assert len(step_logs(hybrid_ckpt, "loss")) == 40  # the checkpoint's log history, then the resumed steps
    assert step_logs(hybrid_ckpt, "loss")[step:] == step_logs(reference, "loss")[step:]
    expected = _params(reference)
    assert all(torch.equal(value, expected[name]) for name, value in _params(hybrid_ckpt).items())


class _WeightsAtTrainBegin(TrainerCallback):
    """The model's weights when training begins (after a checkpoint was loaded)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.weights = {name: t.detach().clone() for name, t in model.state_dict().items()}


def _plain_resume(folder, out):
    from helpers import plain_trainer

    plain = plain_trainer(out, max_steps=40, restore_callback_states_from_checkpoint=True)
    at_begin = _WeightsAtTrainBegin()
    plain.add_callback(at_begin)
    plain.train(resume_from_checkpoint=str(folder))
    assert plain.state.global_step == 40
    return plain, at_begin.weights


def test_another_lora_rank_is_refused(tmp_path):
    from helpers import lora_gpt2

    first = hybrid_trainer(
        tmp_path, model=lora_gpt2(rank=4), max_steps=12, save_strategy="steps", save_steps=12
    )
    first.train()
    second = hybrid_trainer(tmp_path / "b", model=lora_gpt2(rank=8), max_steps=20)
    _assert_refused_before_any_step(
        second, tmp_path / "checkpoint-12", r"trainable parameters differ.*different shapes \['base_model"
    )


def _edit_state(folder, edit_entry=None, edit_tree=None):
    """Change the checkpoint's entry and/or its readable state, keeping the checksum consistent (a state
    written wrongly, not a file damaged on disk)."""
    path = folder / "trainer_state.json"
    state = json.loads(path.read_text())
    entry = state["stateful_callbacks"]["HybridStateCallback"]["attributes"]["engine_state"]
    if edit_tree is not None:
        tree = read_json(folder / HYBRID_STATE_JSON)
        edit_tree(tree)
        entry["sha256"]["state"] = write_json(folder / HYBRID_STATE_JSON, tree)
    if edit_entry is not None:
        edit_entry(entry)
    path.write_text(json.dumps(state))


@pytest.mark.parametrize(
    ("entry_damage", "tree_damage", "message"),
    [
        (lambda e: e.update(format_version=99), None, r"format 99 is not supported"),
        (None, lambda t: t.pop("bandit"), r"cannot resume the hybrid engine.*'bandit'"),
        (None, lambda t: t["watch"]["predictor"].update(name="null"), r"predictor state is for 'null'"),
    ],
)
def test_damaged_or_newer_state_entries_are_refused(
    straight_run, tmp_path, entry_damage, tree_damage, message
):
    import shutil

    out, _, saved = straight_run
    folder = tmp_path / "checkpoint-x"
    shutil.copytree(out / f"checkpoint-{saved['correct']}", folder)
    _edit_state(folder, entry_damage, tree_damage)
    trainer = hybrid_trainer(tmp_path / "run", max_steps=40)
    _assert_refused_before_any_step(trainer, folder, message)


def _drop_one_tensor(data: bytes) -> bytes:
    """A well-formed safetensors file that lacks one of the tensors the readable state refers to."""
    from safetensors.torch import load, save

    tensors = load(data)
    tensors.pop(sorted(tensors)[0])
    return save(tensors)


@pytest.mark.parametrize("checksum", ["recomputed", "absent"])
@pytest.mark.parametrize(
    ("file", "damage", "message"),
    [
        (HYBRID_STATE_JSON, lambda data: data[: len(data) // 2], r"hybrid_state.json.gz cannot be read"),
        (HYBRID_STATE_JSON, lambda data: b"[1, 2]", r"hybrid_state.json.gz cannot be read"),
        (HYBRID_STATE_JSON, lambda data: gzip.compress(b"[1, 2]"), r"json.gz does not hold an engine state"),
        (HYBRID_STATE_FILE, lambda data: data[: len(data) // 2], r"hybrid_state.safetensors cannot be read"),
        (HYBRID_STATE_FILE, _drop_one_tensor, r"the hybrid state is damaged"),
    ],
    ids=["json_truncated", "json_not_gzip", "json_not_a_state", "tensors_truncated", "tensors_missing_one"],
)
def test_a_damaged_state_file_is_refused_whatever_its_checksum_says(
    straight_run, tmp_path, file, damage, message, checksum
):
    """The checksum catches a file damaged after it was written (tests above); a file written damaged
    (its checksum recomputed) or a checkpoint without checksums is still refused, by the reading itself."""
    import shutil

    out, _, saved = straight_run
    folder = tmp_path / "checkpoint-x"
    shutil.copytree(out / f"checkpoint-{saved['correct']}", folder)
    path = folder / file
    path.write_bytes(damage(path.read_bytes()))
    kind = "state" if file == HYBRID_STATE_JSON else "tensors"
    new_sum = file_sha256(path) if checksum == "recomputed" else None
    _edit_state(folder, edit_entry=lambda entry: entry["sha256"].update({kind: new_sum}))
    trainer = hybrid_trainer(tmp_path / "run", max_steps=40)
    _assert_refused_before_any_step(trainer, folder, rf"{message}.*hybrid_restart_engine=True")


def test_an_edited_state_file_is_refused_by_its_checksum(straight_run, tmp_path):
    import shutil

    out, _, saved = straight_run
    folder = tmp_path / "checkpoint-x"
    shutil.copytree(out / f"checkpoint-{saved['correct']}", folder)
    tree = read_json(folder / HYBRID_STATE_JSON)
    tree["counters"]["rollbacks"] = 99
    write_json(folder / HYBRID_STATE_JSON, tree)
    trainer = hybrid_trainer(tmp_path / "run", max_steps=40)
    _assert_refused_before_any_step(trainer, folder, r"hybrid_state.json.gz is corrupt or truncated")


def test_a_missing_tensor_file_is_refused(straight_run, tmp_path):
    import shutil

    out, _, saved = straight_run
    folder = tmp_path / "checkpoint-x"
    shutil.copytree(out / f"checkpoint-{saved['correct']}", folder)
    (folder / HYBRID_STATE_FILE).unlink()
    trainer = hybrid_trainer(tmp_path / "run", max_steps=40)
    _assert_refused_before_any_step(trainer, folder, r"hybrid_state.safetensors is missing")


def test_rotation_keeps_each_hybrid_state_with_its_checkpoint(tmp_path):
    trainer = hybrid_trainer(tmp_path, max_steps=30, save_strategy="steps", save_steps=5, save_total_limit=2)
    trainer.train()
    folders = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    assert folders == ["checkpoint-25", "checkpoint-30"]
    for name in folders:
        assert (tmp_path / name / HYBRID_STATE_FILE).is_file()


def test_a_checkpoint_without_its_hybrid_state_is_refused_once_or_restarted_at_its_step(tmp_path, caplog):
    """Issue 24, item 4: the warning said "training starts from step 0, so steps 1-40 will be trained
    again" and then the resume raised. Now: one error that names what is missing and the escape; with
    `hybrid_restart_engine=True` the run resumes at the checkpoint's step, and nothing says otherwise."""
    out = tmp_path / "out"
    hybrid_trainer(out, max_steps=20, save_strategy="steps", save_steps=20).train()
    (out / "checkpoint-20" / HYBRID_STATE_FILE).unlink()
    trainer = hybrid_trainer(out, max_steps=30, save_strategy="no")
    forwards = []
    trainer.model.register_forward_hook(lambda *args: forwards.append(1))
    with caplog.at_level("WARNING", logger="hf_hybrid"), pytest.raises(HybridCheckpointError) as refused:
        trainer.train(resume_from_checkpoint=True)
    assert str(refused.value) == (
        f"no checkpoint in {out} can be resumed (checkpoint-20 lacks {HYBRID_STATE_FILE}); set "
        "`hybrid_restart_engine=True` to resume the newest one with a new engine, or remove them to train "
        "from step 0"
    )
    assert forwards == [] and "trained again" not in caplog.text
    caplog.clear()
    restarted = hybrid_trainer(out, max_steps=30, save_strategy="no", hybrid_restart_engine=True)
    with caplog.at_level("WARNING", logger="hf_hybrid"):
        restarted.train(resume_from_checkpoint=True)
    assert restarted.state.global_step == 30 and len(restarted.hybrid_timeline) == 30
    assert "a new engine from" in caplog.text and "trained again" not in caplog.text


def test_log_lines_number_steps_as_the_trainer_does_after_a_restart(straight_run, tmp_path, caplog):
    """Issue 24, item 5: after `hybrid_restart_engine=True` a log line said "step 52" where the timeline
    said 92; the engine now numbers its log lines by the Trainer's global step."""
    out, _, saved = straight_run
    step = saved["correct"]
    trainer = hybrid_trainer(
        tmp_path, max_steps=40, hybrid_restart_engine=True, hybrid_confidence_threshold=0.99
    )
    spike_at = step + 15  # after the new engine's warmup and its monitor's first observations

    def spike(module, inputs, output):
        if trainer.state.global_step + 1 == spike_at:
            output.loss = output.loss * 5.0
        return output

    trainer.model.register_forward_hook(spike)
    with caplog.at_level("INFO", logger="hf_hybrid"):
        trainer.train(resume_from_checkpoint=str(out / f"checkpoint-{step}"))
    acted = [row["step"] for row in trainer.hybrid_timeline if row["action"] != "continue"]
    logged = [r.hybrid_step for r in caplog.records if getattr(r, "hybrid_action", None)]
    assert acted == [spike_at] and logged == acted
    assert f"step {spike_at} (full)" in caplog.text
