import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from skip_gate import SkipGate, read_allowed_skips  # noqa: E402

torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipGate(read_allowed_skips()), "hf_hybrid_skip_gate")
