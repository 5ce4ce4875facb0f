"""Padding not computed: the packed forward is the padded forward's maths (per example, to 1e-5), the naive
one is not; the methods train the same examples per step, counted in tokens, priced per token."""

from __future__ import annotations

import itertools
from itertools import islice

import pytest
import torch
from datasets import Dataset

from hf_hybrid.bench import BenchTask
from hf_hybrid.bench.calibration import calibrate
from hf_hybrid.bench.methods import MethodError, TrialContext, parse_method
from hf_hybrid.bench.methods.base import TOKEN, prices_tokens, token_kind
from hf_hybrid.bench.methods.packing import (
    ConcatenatedRows,
    PackedRows,
    PadToLongest,
    length_spread,
    nothing_to_gain,
    packed_attention_leak,
)
from hf_hybrid.bench.methods.selective_backprop import per_sample_loss
from hf_hybrid.bench.runner import LossTrace, quiet

LENGTHS = (5, 17, 9, 31, 12, 6, 23, 8, 14, 30, 7, 11)  # 12 examples: batch 4 x 3 steps is one epoch
PROMPT = 3


def _gpt2(seed: int = 0, dropout: float = 0.0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=64,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )
    return GPT2LMHeadModel(config)


def _examples(lengths=LENGTHS) -> list[dict[str, list[int]]]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for n in lengths:
        ids = torch.randint(1, 64, (n,), generator=generator).tolist()
        out.append({"input_ids": ids, "labels": [-100] * PROMPT + ids[PROMPT:]})
    return out


def _task(lengths=LENGTHS, collator=None) -> BenchTask:
    data = Dataset.from_list(_examples(lengths))
    return BenchTask(
        name="varied",
        task_type="causal_lm",
        build_model=_gpt2,
        train=data,
        evaluation=data,
        learning_rate=1e-3,
        max_steps=3,
        batch_size=4,
        eval_batch_size=4,
        data_collator=collator or PadToLongest(pad_token_id=0),
        info={"max_length": 32},
    )


def _per_example(logits: torch.Tensor, labels: torch.Tensor, spans: list[tuple[int, int]]) -> list[float]:
    """Each example's mean loss over its scored tokens, from one row holding the examples at `spans`."""
    token = torch.nn.functional.cross_entropy(logits[0, :-1], labels[0, 1:], reduction="none")
    scored = labels[0, 1:] != -100
    return [float(token[a : b - 1][scored[a : b - 1]].mean()) for a, b in spans]


def test_packed_per_example_losses_equal_the_padded_ones_and_naive_packings_do_not():
    from transformers import DataCollatorWithFlattening

    model = _gpt2().eval()
    assert model.config.use_cache  # a fresh config's default: the forward builds a cache, and then ...
    assert packed_attention_leak(model) < 1e-5  # (the probe runs without one, as packing trains)
    flat = DataCollatorWithFlattening(return_position_ids=True, separator_id=-100)(_examples((5, 9)))
    with torch.no_grad():
        cached = model(input_ids=flat["input_ids"], position_ids=flat["position_ids"]).logits[0, 5:]
        alone = model(input_ids=flat["input_ids"][:, 5:]).logits[0]
    assert (cached - alone).abs().max() > 1e-3  # ... transformers does not find the packed examples
    model.config.use_cache = False  # as the Trainer sets it (TrainingArguments.use_cache)
    features = _examples((5, 9, 12, 6))  # 32 tokens: one naive row within the model's 32 positions
    spans, start = [], 0
    for f in features:
        spans.append((start, start + len(f["input_ids"])))
        start += len(f["input_ids"])
    with torch.no_grad():
        padded = PadToLongest(pad_token_id=0)(features)
        reference = per_sample_loss(model(**padded).logits, padded["labels"]).tolist()
        flat = DataCollatorWithFlattening(return_position_ids=True, separator_id=-100)(features)
        assert flat["input_ids"].shape == (1, start)  # one row, no padding
        packed = _per_example(model(**flat).logits, flat["labels"], spans)
        naive = ConcatenatedRows(row_length=start, pad_token_id=0)(features)  # one row: no example cut
        attending = _per_example(model(**naive).logits, naive["labels"], spans)
    assert packed == pytest.approx(reference, abs=1e-5)
    assert attending[0] == pytest.approx(reference[0], abs=1e-5)  # the first has nothing before it
    assert max(abs(a - r) for a, r in zip(attending[1:], reference[1:], strict=True)) > 1e-3


def test_naive_rows_cut_the_stream_and_pad_only_the_last_row():
    features = _examples((5, 17, 9))
    batch = ConcatenatedRows(row_length=8, pad_token_id=0)(features)
    assert batch["input_ids"].shape == (4, 8)  # 31 tokens in rows of 8
    assert batch["attention_mask"].sum() == 31 and batch["attention_mask"][:3].all()
    stream = [t for f in features for t in f["input_ids"]]
    assert batch["input_ids"].flatten()[:31].tolist() == stream
    assert (batch["labels"].flatten()[31:] == -100).all()


def _segments(logits: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> list[float]:
    """Each scored example's mean loss, found in packed rows by its `position_ids` restarting at 0."""
    out = []
    for row in range(labels.shape[0]):
        token = torch.nn.functional.cross_entropy(logits[row, :-1], labels[row, 1:], reduction="none")
        starts = [*(positions[row] == 0).nonzero().flatten().tolist(), labels.shape[1]]
        for a, b in itertools.pairwise(starts):
            scored = labels[row, a + 1 : b] != -100
            if scored.any():
                out.append(float(token[a : b - 1][scored].mean()))
    return sorted(out)


def test_rows_of_the_maximum_length_keep_examples_apart_too():
    model = _gpt2().eval()
    model.config.use_cache = False
    features = _examples(LENGTHS)
    batch = PackedRows(row_length=32, pad_token_id=0)(features)
    assert batch["input_ids"].shape == (6, 32) and "attention_mask" not in batch  # 173 tokens in 6 rows
    assert sorted(batch["input_ids"].flatten().tolist()) == sorted(
        [t for f in features for t in f["input_ids"]] + [0] * (6 * 32 - sum(LENGTHS))
    )
    with torch.no_grad():
        padded = PadToLongest(pad_token_id=0)(features)
        reference = per_sample_loss(model(**padded).logits, padded["labels"]).tolist()
        packed = _segments(model(**batch).logits, batch["labels"], batch["position_ids"])
    assert packed == pytest.approx(sorted(reference), abs=1e-5)


def _train(task: BenchTask, spec: str, steps: int = 3, **extra) -> tuple[object, list[float]]:
    trace = LossTrace()
    resume = extra.pop("resume", None)
    ctx = TrialContext(
        task=task,
        learning_rate=1e-3,
        seed=0,
        steps=steps,
        output_dir=extra.pop("output_dir", "unused"),
        callbacks=[trace],
        extra_args={"eval_strategy": "no", "logging_strategy": "no", "report_to": "none", **extra},
    )
    trainer = quiet(parse_method(spec).build(ctx))
    trace.trainer = trainer
    trainer.train(resume_from_checkpoint=resume)
    return trainer, trace.losses


def test_packing_trains_plains_steps_on_fewer_tokens_counted_exactly_with_evaluation_between():
    task = _task()
    assert prices_tokens(task)
    plain, plain_losses = _train(task, "plain", eval_strategy="steps", eval_steps=1)
    packing, packing_losses = _train(task, "packing", eval_strategy="steps", eval_steps=1)
    assert packing_losses == pytest.approx(plain_losses, abs=1e-5)  # dropout off: the same maths
    assert packing.model.config.use_cache is False  # the Trainer's doing: packed examples found
    rows, rows_losses = _train(task, "packing:rows")
    assert rows_losses == pytest.approx(plain_losses, abs=1e-5)
    assert parse_method("packing:rows").step_counts(rows, 3)[TOKEN] % 32 == 0  # whole rows of 32
    method = parse_method("packing")
    assert method.same_trajectory
    # one epoch: packing processed every example's tokens once, evaluations not counted
    assert method.step_counts(packing, 3) == {TOKEN: sum(LENGTHS)}
    padded = parse_method("plain").step_counts(plain, 3)[TOKEN]
    assert padded > sum(LENGTHS) and padded % 4 == 0
    naive, _ = _train(task, "packing-naive")
    assert parse_method("packing-naive").step_counts(naive, 3)[TOKEN] % 32 == 0  # whole rows of 32


def test_the_token_count_travels_in_the_checkpoint(tmp_path):
    task = _task()
    whole, _ = _train(task, "packing", output_dir=str(tmp_path / "a"))
    first, _ = _train(
        task, "packing", steps=3, output_dir=str(tmp_path / "b"), save_strategy="steps", save_steps=2
    )
    resumed, _ = _train(
        task, "packing", output_dir=str(tmp_path / "b"), resume=str(tmp_path / "b" / "checkpoint-2")
    )
    assert resumed.state.num_input_tokens_seen == whole.state.num_input_tokens_seen == sum(LENGTHS)
    assert first.state.num_input_tokens_seen == sum(LENGTHS)


def test_group_by_length_batches_similar_lengths():
    task = _task(LENGTHS * 8)
    trainer, _ = _train(task, "group_by_length", steps=4)
    plain, _ = _train(task, "plain", steps=1)

    def spread(trainer) -> int:
        """How far lengths differ inside each of the first 8 batches, summed."""
        batches = islice(trainer.get_train_dataloader(), 8)
        return sum(int(b["attention_mask"].sum(1).max() - b["attention_mask"].sum(1).min()) for b in batches)

    assert spread(trainer) < spread(plain) / 2


def test_tokens_are_priced_per_token_on_varied_tasks_and_steps_stay_steps_elsewhere():
    task = _task()
    calibration = calibrate(
        task, [parse_method("packing"), parse_method("freeze:1")], warm_steps=1, timed_steps=2
    )
    assert {"step", TOKEN, "freeze:1:step", "freeze:1:token"} <= set(calibration.step_seconds)
    assert 0 < calibration.units(TOKEN) < calibration.units("step") / 8  # a step holds more than 8 tokens
    assert token_kind("args:optim=adamw_torch_fused:step") == "args:optim=adamw_torch_fused:token"
    fixed = _task(collator=lambda features: PadToLongest(0)(features))  # no price per token declared
    assert not prices_tokens(fixed)
    trainer, _ = _train(fixed, "plain", steps=2)
    assert parse_method("plain").step_counts(trainer, 2) == {"step": 2}
    assert "token" not in calibrate(fixed, [], warm_steps=1, timed_steps=1).step_seconds


def test_one_length_has_nothing_to_gain_and_the_methods_decline():
    assert length_spread([4, 8, 8, 16], 2).padding_share == pytest.approx(1 - 36 / 48)
    varied, uniform = _task(), _task((12,) * 12)
    assert nothing_to_gain(varied) is None
    message = nothing_to_gain(uniform)
    assert message.startswith("nothing to gain from packing") and "padding is 0.0%" in message
    for spec in ("packing", "packing-naive", "group_by_length"):
        assert parse_method(spec).declines(uniform) == message and parse_method(spec).declines(varied) is None
    assert parse_method("plain").declines(uniform) is None


def test_packing_refuses_a_model_whose_attention_leaks_across_packed_examples():
    assert packed_attention_leak(_gpt2()) < 1e-5

    class Leaky(torch.nn.Module):
        """Each position sees the mean of every earlier token of its row, whatever the position ids."""

        config = type("Config", (), {"vocab_size": 64})()

        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(64, 8)

        def forward(self, input_ids, position_ids=None, **kwargs):
            hidden = self.embed(input_ids).cumsum(1) / torch.arange(1, input_ids.shape[1] + 1)[None, :, None]
            return type("Out", (), {"logits": hidden})()

    with pytest.raises(MethodError, match="attends across packed examples"):
        parse_method("packing").check_model(Leaky())
