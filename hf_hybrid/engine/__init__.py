"""The predictive-training algorithm in plain PyTorch; never imports transformers.

`HybridEngine` is the algorithm behind two calls per optimizer step; `HybridOptimizer` makes them where
a loop calls `optimizer.step()`. One step, through all of them: docs/how-it-works.md.
"""
