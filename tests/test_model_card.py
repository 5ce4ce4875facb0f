"""Model cards: the "Hybrid training" section and the `hf-hybrid` tag, for full and peft models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import hybrid_trainer, lora_gpt2, tiny_gpt2
from huggingface_hub import ModelCard

from hf_hybrid.model_card import HYBRID_TAG, SECTION_START, add_hybrid_section


def card_of(trainer: Any) -> ModelCard:
    return ModelCard.load(Path(trainer.args.output_dir) / "README.md")


def assert_section_has_the_run(text: str, stats: dict[str, Any], args: Any) -> None:
    assert text.count("## Hybrid training") == 1
    assert text.count(SECTION_START) == 1
    per_phase = stats["steps_per_phase"]
    phases = f"{per_phase['warmup']} / {per_phase['full']} / {per_phase['predict']} / {per_phase['correct']}"
    assert f"| steps per phase (warmup / full / predict / correct) | {phases} |" in text
    skipped = f"{stats['backward_skipped']} ({100 * stats['backward_skipped_fraction']:.1f}%)"
    assert f"| backward passes skipped | {skipped} |" in text
    assert f"| backward passes run | {stats['backward_run']} |" in text
    assert f"| rollbacks | {stats['rollbacks']} |" in text
    saved = f"{100 * stats['compute_saved_fraction']:.1f}%"
    assert f"| compute saved, nominal cost model (forward 1, backward 2; not measured) | {saved} |" in text
    assert f"| `hybrid_warmup_steps` | `{args.hybrid_warmup_steps}` |" in text
    assert f"| `hybrid_predictor` | `{args.hybrid_predictor}` |" in text
    assert "| mean update skill | " in text and "| mean update skill | n/a |" not in text
    assert "| wall-clock time saved, measured per step | " in text
    assert f"| `hybrid_seed` | `{args.seed}` |" in text  # resolved: the training seed, not None
    assert stats["spike_guard"] and args.hybrid_spike_guard == "auto"  # on, with no flag given
    assert "| spike guard | on (`hybrid_spike_guard=auto`, the default) | " in text
    assert f"| spike guard: outsized updates taken back | {stats['updates_taken_back']}" in text
    assert_every_number_is_explained(text, args.hybrid_confidence_threshold)


def assert_every_number_is_explained(text: str, threshold: float) -> None:
    """Every row of the section's tables has a third cell that says what its number or setting means."""
    section = text[text.index("## Hybrid training") :]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| |")]
    rows = [row for row in rows if not row.startswith(("| setting |", "|---"))]
    assert len(rows) > 20
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert len(cells) == 3 and len(cells[2]) > 10, row
    skill = next(row for row in rows if row.startswith("| mean update skill |"))
    assert "1 = perfect guess, 0 = no better than skipping the update" in skill
    assert f"needs ≥ the threshold {threshold:g}" in skill


def test_card_of_a_full_model_has_the_section_and_tag(tmp_path):
    trainer = hybrid_trainer(tmp_path, max_steps=30)
    trainer.train()
    stats = trainer.hybrid_stats()
    assert stats["backward_skipped"] > 0
    trainer.create_model_card(model_name="tiny-hybrid", tags=["mine"])
    card = card_of(trainer)
    assert {"mine", "generated_from_trainer", HYBRID_TAG} <= set(card.data.tags)
    assert "tiny-hybrid" in card.text  # HF's own card is still there
    assert_section_has_the_run(card.text, stats, trainer.args)
    # a second card (e.g. push_to_hub after create_model_card) replaces the section, never duplicates it
    trainer.create_model_card()
    card = card_of(trainer)
    assert card.data.tags.count(HYBRID_TAG) == 1
    assert_section_has_the_run(card.text, stats, trainer.args)


def test_card_of_a_peft_model_keeps_the_tag_after_peft_rewrites_the_tags(tmp_path):
    trainer = hybrid_trainer(tmp_path, model=lora_gpt2(), max_steps=30)
    trainer.train()
    trainer.save_model()  # peft writes its own README.md; HF then hands the card to peft to update
    trainer.create_model_card()
    card = card_of(trainer)
    assert card.data.library_name == "peft"
    assert HYBRID_TAG in card.data.tags and "lora" in card.data.tags
    stats = trainer.hybrid_stats()
    assert stats["predictor_bytes"] < 4 * sum(p.numel() for p in trainer.model.parameters())
    assert_section_has_the_run(card.text, stats, trainer.args)


def test_push_to_hub_card_has_the_section(tmp_path, monkeypatch):
    import transformers.trainer as hf_trainer

    uploaded: dict[str, str] = {}

    class FakeApi:
        def upload_folder(self, folder_path: str, **kwargs: Any) -> str:
            uploaded["readme"] = (Path(folder_path) / "README.md").read_text()
            return "done"

    monkeypatch.setattr(hf_trainer, "hf_api", lambda: FakeApi())
    trainer = hybrid_trainer(tmp_path, max_steps=20)
    trainer.train()
    trainer.hub_model_id = "someone/tiny-hybrid"  # as if init_hf_repo had run; no network
    trainer.push_to_hub()
    assert "## Hybrid training" in uploaded["readme"]
    assert f"- {HYBRID_TAG}" in uploaded["readme"].split("---")[1]  # in the YAML metadata


def test_no_section_off_the_main_process_or_without_the_engine(tmp_path, monkeypatch):
    trainer = hybrid_trainer(tmp_path / "rank1", max_steps=12)
    trainer.train()
    monkeypatch.setattr(trainer, "is_world_process_zero", lambda: False)
    trainer.create_model_card()
    assert not (tmp_path / "rank1" / "README.md").exists()
    plain = hybrid_trainer(tmp_path / "plain", max_steps=3, hybrid_enabled=False)
    plain.train()
    plain.create_model_card()
    card = card_of(plain)
    assert HYBRID_TAG not in card.data.tags and "## Hybrid training" not in card.text


def test_add_hybrid_section_to_a_missing_card(tmp_path):
    readme = tmp_path / "README.md"
    add_hybrid_section(readme, f"{SECTION_START}\n## Hybrid training\nx\n<!-- hf-hybrid:end -->\n")
    card = ModelCard.load(readme)
    assert card.data.tags == [HYBRID_TAG]
    assert card.text.count("## Hybrid training") == 1


@pytest.mark.parametrize("skipped", [0, 5])
def test_template_intro_says_whether_steps_were_predicted(skipped):
    from hf_hybrid.model_card import card_context, render_section

    stats = {
        "steps": 10,
        "steps_per_phase": {"warmup": 5, "full": 5 - skipped, "predict": skipped, "correct": 0},
        "backward_run": 10 - skipped,
        "backward_skipped": skipped,
        "backward_skipped_fraction": skipped / 10,
        "predict_phases": int(skipped > 0),
        "rollbacks": 0,
        "forced_full": 0,
        "refused_updates": 0,
        "compute_saved_fraction": 0.0,
        "predictor_bytes": 8,
        "engine_bytes": 16,
    }
    text = render_section(card_context(stats, {}, {"hybrid_predictor": "ema"}, []))
    if skipped:
        assert f"{skipped} of its 10 optimizer steps skipped the backward pass" in text
    else:
        assert "No optimizer step was predicted" in text
        assert "never reached the\nthreshold" in text  # 5 warmup and 5 full steps: the bar was not met
        warmup_only = {**stats, "steps_per_phase": {"warmup": 10, "full": 0, "predict": 0, "correct": 0}}
        text = render_section(card_context(warmup_only, {}, {"hybrid_predictor": "ema"}, []))
        assert "No optimizer step was predicted: the run ended within its warmup (10 steps)" in text
    assert "| mean update skill | n/a |" in text


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_guard_that_was_off_says_so(mode):
    """A card never leaves the guard unmentioned: off by the user, or `auto` with nothing that fitted."""
    from hf_hybrid.model_card import card_context, render_section

    stats = {
        "steps": 4,
        "steps_per_phase": {"warmup": 4, "full": 0, "predict": 0, "correct": 0},
        "backward_run": 4,
        "backward_skipped": 0,
        "backward_skipped_fraction": 0.0,
        "predict_phases": 0,
        "rollbacks": 0,
        "forced_full": 0,
        "refused_updates": 0,
        "compute_saved_fraction": 0.0,
        "predictor_bytes": 8,
        "engine_bytes": 16,
    }
    text = render_section(card_context(stats, {}, {"hybrid_spike_guard": mode}, []))
    said = {"auto": "off (`auto`: no copy fitted", "off": "off (`hybrid_spike_guard=off`)"}[mode]
    assert f"| spike guard | {said}" in text
    assert "| spike guard: restores" not in text


def test_intro_of_a_run_that_never_predicted_gives_the_confidence_against_the_threshold():
    from hf_hybrid.model_card import card_context, render_section

    stats = {"steps": 4, "steps_per_phase": {"warmup": 2, "full": 2, "predict": 0, "correct": 0},
             "backward_run": 4, "backward_skipped": 0, "backward_skipped_fraction": 0.0, "predict_phases": 0,
             "rollbacks": 0, "forced_full": 0, "refused_updates": 0, "compute_saved_fraction": 0.0,
             "predictor_bytes": 8, "engine_bytes": 16, "max_confidence": 0.39}  # fmt: skip
    config = {"hybrid_confidence_threshold": 0.85, "hybrid_seed": 42}
    text = render_section(card_context(stats, {"update_skill": 0.0735}, config, []))
    assert "the measured confidence (at most 0.3900) never reached the\nthreshold 0.85" in text
    assert "| highest confidence reached | 0.3900 | " in text
    assert "| mean update skill | 0.0735 | 1 − ‖guess − real‖² / ‖real‖²: 1 = perfect guess" in text
    assert "| `hybrid_seed` | `42` | Seed of the engine's own generators" in text


def test_a_local_base_model_path_written_by_peft_is_replaced_by_the_given_name(tmp_path):
    local = tmp_path / "site-packages" / "minilm"
    local.mkdir(parents=True)
    readme = tmp_path / "README.md"
    metadata = f"library_name: peft\nbase_model: {local}\ntags:\n- base_model:adapter:{local}\n- lora\n"
    readme.write_text(f"---\n{metadata}---\n\n# run\n")
    add_hybrid_section(readme, f"{SECTION_START}\n## Hybrid training\nx\n<!-- hf-hybrid:end -->\n",
                       base_model="sentence-transformers/all-MiniLM-L6-v2")  # fmt: skip
    card = ModelCard.load(readme)
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert card.data.tags == ["base_model:adapter:sentence-transformers/all-MiniLM-L6-v2", "lora", HYBRID_TAG]
    assert str(local) not in readme.read_text()
    # a Hub id peft wrote is left alone, and so is a card without a base model
    add_hybrid_section(readme, f"{SECTION_START}\n## Hybrid training\ny\n<!-- hf-hybrid:end -->\n",
                       base_model="someone/else")  # fmt: skip
    assert ModelCard.load(readme).data.base_model == "sentence-transformers/all-MiniLM-L6-v2"


def test_a_lora_of_a_locally_saved_model_is_not_called_trained_from_scratch(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2LMHeadModel

    from hf_hybrid.model_card import FROM_SCRATCH

    base_dir = tmp_path / "my-base"
    tiny_gpt2().save_pretrained(base_dir)  # what a user fine-tunes when the hub is out of reach
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM"
    )
    model = get_peft_model(GPT2LMHeadModel.from_pretrained(base_dir), config)
    trainer = hybrid_trainer(tmp_path / "out", model=model, max_steps=12)
    trainer.train()
    trainer.create_model_card()
    text = card_of(trainer).text
    assert FROM_SCRATCH not in text
    assert f"fine-tuned version of the model in the local directory `{base_dir}`" in text
    assert "pass `finetuned_from=`" in text


def test_a_model_from_a_config_is_still_trained_from_scratch(tmp_path):
    from hf_hybrid.model_card import FROM_SCRATCH

    trainer = hybrid_trainer(tmp_path, max_steps=12)
    trainer.train()
    trainer.create_model_card()
    assert FROM_SCRATCH in card_of(trainer).text
