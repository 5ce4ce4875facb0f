"""The sleeping engine's sampled skill tracks the skill on the whole parameters. On a 2x64 GPT-2 (121k
weights, 315 sampled coordinates) over 80 steps: each step within 0.2, every mean of 16 steps (what the
confidence is) within 0.1, the whole run's mean within 0.03. The error shrinks as 1/sqrt(sampled
coordinates), and a large model has many more (up to 65,536 per tensor)."""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_hybrid.data import stdlib_lm_datasets
from hf_hybrid.engine.predictor import EMAPredictor, delta_dot_products
from hf_hybrid.engine.residuals import Residual
from hf_hybrid.engine.sample import CoordinateSample


def _skill(predicted, real) -> float:
    pd, pp, dd = delta_dot_products(predicted, real)
    return Residual(0, "full", 1, pd, pp, dd).skill(1.0)


def test_sampled_skill_tracks_the_full_skill():
    torch.manual_seed(0)
    train, _ = stdlib_lm_datasets(block_size=64, train_blocks=1024, eval_blocks=8)
    ids = torch.tensor(train["input_ids"])
    config = GPT2Config(
        vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    params = dict(model.named_parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    sample = CoordinateSample({n: p.shape for n, p in params.items()}, seed=0)
    full_ema, sampled_ema = EMAPredictor(), EMAPredictor()
    generator = torch.Generator().manual_seed(0)
    full, sampled = [], []
    for step in range(100):
        before = {n: p.detach().clone() for n, p in params.items()}
        batch = ids[torch.randint(0, len(ids), (16,), generator=generator)]
        optimizer.zero_grad()
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        real = {n: p.detach() - before[n] for n, p in params.items()}
        real_sampled = {n: sample.gather(n, d) for n, d in real.items()}
        if step >= 20:  # past the first, fastest-changing updates
            full.append(_skill(full_ema.predict(1), real))
            sampled.append(_skill(sampled_ema.predict(1), real_sampled))
        full_ema.observe(real)
        sampled_ema.observe(real_sampled)  # what the sleeping engine's predictor sees
    assert 0.001 < sample.fraction < 0.005
    assert max(abs(f - s) for f, s in zip(full, sampled, strict=True)) < 0.2
    windows = range(0, len(full) - 16)
    worst = max(abs(sum(full[i : i + 16]) - sum(sampled[i : i + 16])) / 16 for i in windows)
    assert worst < 0.1, worst
    assert abs(sum(full) - sum(sampled)) / len(full) < 0.03
