"""A pretrained decoder that exists offline: a byte-level GPT-2 pretrained here on the standard library.

The decoder tasks need a *pretrained* causal LM without a download: this pretrains one deterministically
on the stdlib's source (without `pydoc_data`, the fine-tune text: Python's reference documentation) and
caches it, named by a hash of the recipe and corpus (first use: ~12 CPU minutes; `python -m
hf_hybrid.bench.decoder` rebuilds it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import torch
from datasets import Dataset
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoModelForCausalLM, GPT2LMHeadModel, Trainer, TrainingArguments

from ..data import held_out_chunks, stdlib_source_files
from ..tiny_models import tiny_gpt2_config

logger = logging.getLogger(__name__)

FINE_TUNE_PACKAGE = "pydoc_data"  # kept out of pretraining: it is the fine-tune text
RECIPE_FILE = "recipe.json"


@dataclass(frozen=True)
class Recipe:
    """How the decoder is pretrained; its hash (with the corpus') names the cache folder."""

    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 4
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 640
    learning_rate: float = 1e-3
    warmup_steps: int = 32
    train_blocks: int = 10240
    seed: int = 0


TINY_RECIPE = Recipe(
    n_layer=2, n_embd=32, n_head=2, seq_len=32, batch_size=4, steps=12, warmup_steps=2, train_blocks=64
)


def recipe_for(seq_len: int) -> Recipe:
    """The tests' tiny recipe for their sequence length, else the default."""
    return TINY_RECIPE if seq_len == TINY_RECIPE.seq_len else Recipe()


def pretraining_blocks(recipe: Recipe) -> list[list[int]]:
    """The first `train_blocks` byte blocks of the stdlib source (sorted by path), `pydoc_data` left out."""
    blocks: list[list[int]] = []
    for path in stdlib_source_files():
        if FINE_TUNE_PACKAGE in path.parts:
            continue
        data = path.read_bytes()
        for start in range(0, len(data) - recipe.seq_len + 1, recipe.seq_len):
            blocks.append(list(data[start : start + recipe.seq_len]))
            if len(blocks) == recipe.train_blocks:
                return blocks
    raise ValueError(f"the standard library gave {len(blocks)} blocks, fewer than {recipe.train_blocks}")


def recipe_hash(recipe: Recipe, blocks: list[list[int]]) -> str:
    digest = hashlib.sha256(json.dumps(asdict(recipe), sort_keys=True).encode())
    digest.update(bytes(b for block in blocks for b in block))
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get("HF_HYBRID_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hf_hybrid"
    )
    return Path(base)


def decoder_path(recipe: Recipe = Recipe(), rebuild: bool = False) -> Path:
    """The pretrained decoder's folder (built first if absent): `from_pretrained` loads it."""
    blocks = pretraining_blocks(recipe)
    folder = cache_root() / f"decoder-{recipe_hash(recipe, blocks)}"
    if rebuild and folder.exists():
        shutil.rmtree(folder)
    if not (folder / RECIPE_FILE).is_file():
        build(recipe, blocks, folder)
    return folder


def build(recipe: Recipe, blocks: list[list[int]], folder: Path) -> None:
    """Pretrain with the plain Trainer and save into `folder` (written beside it, then moved in whole)."""
    logger.warning("hf_hybrid: pretraining the arena's decoder (%s) into %s", recipe, folder)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same weights on every machine with this torch
    try:
        torch.manual_seed(recipe.seed)
        config = tiny_gpt2_config(recipe.n_embd, recipe.n_layer, recipe.n_head, n_positions=recipe.seq_len)
        model = GPT2LMHeadModel(config)
        data = Dataset.from_dict({"input_ids": blocks, "labels": blocks})
        with tempfile.TemporaryDirectory() as tmp:
            trainer = Trainer(model=model, args=_pretraining_arguments(recipe, tmp), train_dataset=data)
            trainer.train()
        losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    finally:
        torch.set_num_threads(threads)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".building-"))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users of the cache
    model.save_pretrained(staging)
    (staging / RECIPE_FILE).write_text(
        json.dumps({"recipe": asdict(recipe), "train_losses": losses}, indent=1) + "\n"
    )
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)


def _pretraining_arguments(recipe: Recipe, output_dir: str) -> TrainingArguments:
    return TrainingArguments(
        output_dir=output_dir,
        max_steps=recipe.steps,
        per_device_train_batch_size=recipe.batch_size,
        learning_rate=recipe.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=recipe.warmup_steps,
        weight_decay=0.01,
        save_strategy="no",
        report_to="none",
        seed=recipe.seed,
        data_seed=recipe.seed,
        disable_tqdm=True,
        logging_steps=max(1, recipe.steps // 8),
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
    )


def docs_blocks(seq_len: int, train_blocks: int, eval_blocks: int) -> tuple[Any, Any, list[int]]:
    """(train, eval, each eval block's topic) byte blocks of Python's docs, 1 chunk of 4 blocks in 3 held
    out (so that the eval set fits in the topics the training set reaches)."""
    documents = []
    for name in sorted(topics):
        raw = topics[name].encode("utf-8") + b"\n\n"
        documents.append([list(raw[i : i + seq_len]) for i in range(0, len(raw) - seq_len + 1, seq_len)])
    train, evaluation, clusters = held_out_chunks(documents, train_blocks, eval_blocks, chunk=4, every=3)
    for split, have, wanted in (("train", train, train_blocks), ("eval", evaluation, eval_blocks)):
        if len(have) < wanted:
            raise ValueError(
                f"the documentation gave {len(have)} {split} blocks of {seq_len} bytes, fewer than {wanted}"
            )
    train_set = Dataset.from_dict({"input_ids": train, "labels": train})
    eval_set = Dataset.from_dict({"input_ids": evaluation, "labels": evaluation})
    return train_set.shuffle(seed=0), eval_set, clusters


def pretrained_decoder(recipe: Recipe, seed: int, lora: bool) -> torch.nn.Module:
    """The cached decoder through `from_pretrained`, with LoRA adapters drawn from `seed`."""
    model = AutoModelForCausalLM.from_pretrained(decoder_path(recipe))
    if lora:
        torch.manual_seed(seed)
        config = LoraConfig(
            task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16, target_modules=["c_attn"], fan_in_fan_out=True
        )
        model = get_peft_model(model, config)
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Build (or rebuild) the arena's pretrained decoder in the cache."
    )
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny recipe")
    parser.add_argument("--rebuild", action="store_true", help="pretrain again even if it is cached")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    print(decoder_path(TINY_RECIPE if opts.tiny else Recipe(), rebuild=opts.rebuild))


if __name__ == "__main__":
    main()
