"""Why a packing layout saves time or not: per layout of the same batches of `instruct_docstrings`, the
tokens, the attention scores an sdpa kernel computes (rows x row length squared) and the measured CPU
seconds of a forward and backward pass on its decoder.

    python benchmarks/packing_layouts.py [--batches 12]

One flattened row per batch (`DataCollatorWithFlattening`) drops the padding but squares a row as long as
the whole batch; rows of the task's maximum length (`packing:rows`) drop padding and keep rows short.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DataCollatorWithFlattening

from hf_hybrid.bench.methods.packing import IGNORE, PackedRows, max_length, pad_token_id
from hf_hybrid.bench.tasks import preset

MODEL_INPUTS = ("input_ids", "labels", "attention_mask", "position_ids")


def measure(batches: int, batch_size: int = 8) -> list[tuple[str, float, float, float]]:
    """(layout, tokens, attention scores, seconds) per batch, averaged over `batches` batches."""
    torch.set_num_threads(1)
    task = preset("instruct_docstrings", "full")
    model = task.build_model(0).train()
    layouts = {
        "padded per batch (plain)": task.data_collator,
        "flattened, one row (packing)": DataCollatorWithFlattening(
            return_position_ids=True, separator_id=IGNORE
        ),
        "bin-packed rows (packing:rows)": PackedRows(max_length(task), pad_token_id(task)),
    }
    examples = [task.train[i] for i in range(batches * batch_size)]
    out = []
    for name, collate in layouts.items():
        tokens = scores = seconds = 0.0
        for b in range(batches):
            features = [
                {"input_ids": e["input_ids"], "labels": e["labels"]}
                for e in examples[b * batch_size :][:batch_size]
            ]
            batch = collate(features)
            rows, length = batch["input_ids"].shape
            tokens, scores = tokens + rows * length, scores + rows * length**2
            start = time.process_time()
            model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS}).loss.backward()
            seconds += time.process_time() - start
            model.zero_grad()
        out.append((name, tokens / batches, scores / batches, seconds / batches))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=12)
    opts = parser.parse_args(argv)
    print("| layout | tokens per batch | attention scores per batch | CPU seconds per step |")
    print("|---|---|---|---|")
    for name, tokens, scores, seconds in measure(opts.batches):
        print(f"| {name} | {tokens:.0f} | {scores:.0f} | {seconds:.3f} |")


if __name__ == "__main__":
    main()
