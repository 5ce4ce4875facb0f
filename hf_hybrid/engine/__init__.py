"""The predictive-training algorithm in plain PyTorch; never imports transformers.

`HybridEngine` (`engine.py`) is the algorithm behind two calls per optimizer step; `HybridOptimizer`
(`optimizer.py`) makes them where a training loop already calls `optimizer.step()`. How one step goes
through the trainer, the optimizer wrapper and the engine is told once: docs/how-it-works.md, "One
optimizer step, in the code".
"""
