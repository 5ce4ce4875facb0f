"""The arena's pretrained decoder: built offline, deterministically, cached by content, loaded with
`from_pretrained`, fine-tuned on text it never saw."""

from __future__ import annotations

import json

import torch

from hf_hybrid.bench import decoder
from hf_hybrid.bench.decoder import TINY_RECIPE, decoder_path, pretraining_blocks


def test_the_tiny_decoder_builds_once_loads_with_from_pretrained_and_fine_tunes(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HYBRID_CACHE", str(tmp_path))
    path = decoder_path(TINY_RECIPE)
    assert path.parent == tmp_path and path.name.startswith("decoder-")
    recipe = json.loads((path / "recipe.json").read_text())
    assert recipe["recipe"]["steps"] == TINY_RECIPE.steps and len(recipe["train_losses"]) >= 2
    assert recipe["train_losses"][-1] < recipe["train_losses"][0]  # it learnt something

    def refuse(*args, **kwargs):
        raise AssertionError("a cached decoder was pretrained again")

    monkeypatch.setattr(decoder, "build", refuse)
    assert decoder_path(TINY_RECIPE) == path  # the cache is used

    from hf_hybrid.bench.tasks import preset

    full, lora = preset("decoder_ft", "tiny"), preset("decoder_lora", "tiny")
    model = full.build_model(0)
    assert model.config._name_or_path == str(path)  # loaded through from_pretrained(local dir)
    adapted = lora.build_model(0)
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert torch.equal(adapted.base_model.model.transformer.wte.weight, model.transformer.wte.weight)


def test_a_changed_recipe_or_corpus_gets_another_folder():
    blocks = pretraining_blocks(TINY_RECIPE)
    base = decoder.recipe_hash(TINY_RECIPE, blocks)
    from dataclasses import replace

    assert decoder.recipe_hash(replace(TINY_RECIPE, steps=13), blocks) != base
    assert decoder.recipe_hash(TINY_RECIPE, [blocks[0][::-1], *blocks[1:]]) != base


def test_the_fine_tune_text_is_kept_out_of_pretraining_and_split_by_topic():
    from pydoc_data.topics import topics

    pretrained = {bytes(b) for b in pretraining_blocks(decoder.Recipe(seq_len=64, train_blocks=20000))}
    train, evaluation = decoder.docs_blocks(64, 200, 40)
    docs = {bytes(b) for b in train["input_ids"]} | {bytes(b) for b in evaluation["input_ids"]}
    assert not docs & pretrained
    held_out = [name for name in topics if decoder.is_eval_topic(name)]
    assert 0 < len(held_out) < len(topics) / 3
