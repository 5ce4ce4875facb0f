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


def test_the_fine_tune_text_is_kept_out_of_pretraining_and_held_out_by_topic():
    """Eval blocks are held-out chunks of the topics trained on (no topic only in eval), and their clusters
    are those topics (what the judge's bootstrap resamples)."""
    from pydoc_data.topics import topics

    pretrained = {bytes(b) for b in pretraining_blocks(decoder.Recipe(seq_len=64, train_blocks=20000))}
    train, evaluation, clusters = decoder.docs_blocks(64, 200, 40)
    trained = {bytes(b) for b in train["input_ids"]}
    held_out = [bytes(b) for b in evaluation["input_ids"]]
    assert not (trained | set(held_out)) & pretrained
    assert not trained & set(held_out)
    assert len(clusters) == len(held_out) == 40 and len(set(clusters)) >= 2
    texts = [topics[name].encode("utf-8") + b"\n\n" for name in sorted(topics)]
    for cluster in set(clusters):
        text = texts[cluster]
        assert all(b in text for b, c in zip(held_out, clusters, strict=True) if c == cluster)
        assert any(b in text for b in trained)  # the topic also trains
