"""A HybridHFTrainer built in a process that `accelerate launch --cpu --num_processes 2` started alone;
prints `WORLD_SIZE <n>` (the launch test reads it beside the library's warning).

python launched_alone.py --out DIR
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import hybrid_trainer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = parser.parse_args().out
    trainer = hybrid_trainer(Path(out), max_steps=2)
    hybrid_trainer(Path(out) / "second", max_steps=2)  # a second trainer: the warning is not repeated
    trainer.train()
    print(f"WORLD_SIZE {trainer.args.world_size}", flush=True)


if __name__ == "__main__":
    main()
