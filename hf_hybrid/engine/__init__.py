"""The predictive-training algorithm in plain PyTorch; never imports transformers."""
