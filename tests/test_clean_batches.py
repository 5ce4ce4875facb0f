"""The kept clean batches as a checkpoint holds them: every input back in its own type and values, each
its own tensor, in a file a fraction of the inputs' own size (token ids in the narrowest integer type,
a causal LM's labels equal to its input ids stored once)."""

from __future__ import annotations

import torch

from hf_hybrid.clean_batches import RecentCleanBatches, file_name


def _inputs(vocab: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (16, 128), generator=torch.Generator().manual_seed(0))
    return {
        "input_ids": ids,
        "labels": ids.clone(),
        "attention_mask": torch.ones_like(ids),
        "pixel_values": torch.randn(2, 3),
        "flags": torch.zeros(4, dtype=torch.bool),
    }


def _kept(inputs: dict[str, torch.Tensor]) -> RecentCleanBatches:
    """8 steps, each with its own tensors (as a loop's batches are)."""

    def current() -> list:
        return [({name: value.clone() for name, value in inputs.items()}, torch.tensor(2048))]

    kept = RecentCleanBatches(current=current, train=lambda batches: None)
    for step in range(1, 9):
        kept.keep(step)
    return kept


def _round_trip(tmp_path, inputs: dict[str, torch.Tensor]) -> RecentCleanBatches:
    _kept(inputs).save(tmp_path, rank=0)
    loaded = RecentCleanBatches(current=list, train=lambda batches: None)
    loaded.load(tmp_path, rank=0, device="cpu")
    return loaded


def test_every_input_comes_back_in_its_own_type_and_values_each_its_own_tensor(tmp_path):
    for vocab in (256, 30522, 50257, 200_000):  # uint8, int16, int32 and int32 ids
        inputs = _inputs(vocab)
        inputs["labels"][:, :3] = -100  # the ignored positions: labels no longer equal the ids
        loaded = _round_trip(tmp_path, inputs)
        assert [step for step, _ in loaded.kept] == list(range(1, 9))
        for _, [(back, num_items)] in loaded.kept:
            assert back.keys() == inputs.keys() and int(num_items) == 2048
            for name, value in inputs.items():
                assert back[name].dtype == value.dtype and torch.equal(back[name], value), (vocab, name)
            back["labels"].add_(1)
            assert torch.equal(back["input_ids"], inputs["input_ids"])


def test_equal_inputs_load_as_separate_tensors(tmp_path):
    inputs = _inputs(256)
    loaded = _round_trip(tmp_path, inputs)
    back = loaded.kept[0][1][0][0]
    assert torch.equal(back["labels"], back["input_ids"])
    back["labels"][0, 0] = -100
    assert back["input_ids"][0, 0] != -100


def test_the_file_is_a_fraction_of_the_inputs_own_size(tmp_path):
    """Byte-level ids (the 2x64 GPT-2's): the inputs as the loop holds them are 48 KiB a step (ids,
    labels and mask in int64); saved, under an eighth of that."""
    inputs = _inputs(256)
    _kept(inputs).save(tmp_path, rank=0)
    as_held = 8 * sum(v.numel() * v.element_size() for v in inputs.values())
    assert (tmp_path / file_name(0)).stat().st_size < as_held / 8
