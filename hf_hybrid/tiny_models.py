"""The byte-level GPT-2, defined once: at 2x64 the model that trains in minutes on a CPU (the demo's,
`hf-hybrid train --model_config tiny`'s and the arena's `clm_stdlib`), at 4x256 the arena's pretrained
decoder (`bench/decoder.py`).

No tokenizer: the 256 byte values are the vocabulary, so there are no special tokens either (GPT-2's
50256 would be out of it); a model that generates from bytes stops on a length, not on an eos.
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from .data import BYTE_VOCAB_SIZE


def tiny_gpt2_config(
    n_embd: int = 64, n_layer: int = 2, n_head: int = 2, n_positions: int = 128
) -> GPT2Config:
    """GPT-2 over bytes, 2x64 by default (125k parameters); `n_positions` is the longest block it reads."""
    return GPT2Config(
        vocab_size=BYTE_VOCAB_SIZE,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=None,
        eos_token_id=None,
    )


def tiny_gpt2(seed: int | None = None, n_positions: int = 128) -> GPT2LMHeadModel:
    """The 2x64 model of `tiny_gpt2_config`, freshly initialised; `seed` seeds torch's global generator
    first (the initialisation draws from it), so two runs with one seed start from the same weights."""
    if seed is not None:
        torch.manual_seed(seed)
    return GPT2LMHeadModel(tiny_gpt2_config(n_positions=n_positions))
