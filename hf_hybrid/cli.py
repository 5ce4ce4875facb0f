"""The `hf-hybrid` console script: the parser and the dispatch of `train`, `demo` and `bench`.

`--version`, `--help` and `train --help` answer without importing transformers (seconds); each
subcommand imports what it needs; `train` runs a recipe of `hf_hybrid.recipes`.

    hf-hybrid demo                                   # plain Trainer vs HybridHFTrainer, a few minutes on CPU
    hf-hybrid train --output_dir out --max_steps 200 # the tiny built-in model on the stdlib corpus
    hf-hybrid train --model_name_or_path gpt2 --dataset corpus.txt --output_dir out --hybrid_warmup_steps 50
    hf-hybrid train args.json                        # every argument from a .json / .yaml file
    hf-hybrid train --task sequence_classification --output_dir out   # MiniLM on the stdlib package task
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from .bench_cli import add_bench_parser, bench_main
from .data import DataError
from .recipes import DEFAULT_TASK, TASKS

TASK_FLAG = "--task"


def _version() -> str:
    try:
        return version("hf-hybrid")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


# ---- entry point ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-hybrid",
        description="Predictive training for the Hugging Face Trainer: skip backward passes when a "
        "predicted update can be trusted, fall back to full training when it cannot.",
    )
    parser.add_argument("--version", action="version", version=f"hf-hybrid {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="{train,demo,bench}")
    sub.add_parser(
        "train",
        help=f"train with HybridHFTrainer: a causal LM, or a sequence classifier with `{TASK_FLAG} "
        "sequence_classification` (every TrainingArguments and hybrid_* field is a flag; "
        "`hf-hybrid train --help` lists the main ones)",
        add_help=False,
    )
    add_bench_parser(sub)
    _add_demo_parser(sub)
    return parser


def _add_demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser(
        "demo",
        help="plain Trainer vs HybridHFTrainer on a small model, offline, a few minutes on CPU",
        description="Train a small byte-level GPT-2 on the Python standard library's source twice, with "
        "the plain transformers.Trainer and with HybridHFTrainer (same init, data, arguments and "
        "learning rate), and print what the phase machine did; then the plain Trainer and the spike guard "
        "alone again with the learning rate x30 for 3 steps at mid-run. A demo, not a benchmark.",
    )
    demo.add_argument(
        "--size",
        choices=["default", "tiny"],
        default="default",
        help="`tiny`: seconds, for tests (default: %(default)s)",
    )
    demo.add_argument(
        "--max-steps",
        type=_positive_int,
        default=None,
        help="optimizer steps per run (default: 600, or 60 with --size tiny)",
    )
    demo.add_argument(
        "--output-dir",
        default="hf_hybrid_demo",
        help="where both runs and demo_results.json go (default: ./%(default)s)",
    )
    demo.add_argument("--seed", type=int, default=0, help="model-init and data-order seed (default: 0)")
    demo.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=1e-3,
        help="peak learning rate of both runs (default: %(default)g)",
    )
    demo.add_argument(
        "--batch-size",
        type=_positive_int,
        default=16,
        help="blocks of 128 bytes per step (default: %(default)s)",
    )
    demo.add_argument(
        "--json", metavar="PATH", default=None, help="also write the results table as JSON here"
    )
    demo.add_argument(
        "--no-spike",
        action="store_true",
        help="skip the second pair of runs, with the learning rate x30 for 3 steps at mid-run (plain "
        "against the hybrid trainer's spike guard)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "train":  # the recipe's parser owns everything after `train`, its --help too
        return train_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "demo":
        from .demo import run_demo

        run_demo(
            size=args.size,
            max_steps=args.max_steps,
            output_dir=args.output_dir,
            seed=args.seed,
            learning_rate=args.learning_rate,
            batch_size=args.batch_size,
            json_path=args.json,
            spike=not args.no_spike,
        )
        return 0
    if args.command == "bench":
        return bench_main(args, parser)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first
    return 2


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def train_main(argv: Sequence[str]) -> int:
    """`hf-hybrid train [--task TASK] ...`: the task's recipe parses and runs everything else."""
    task, rest = _split_task(list(argv))
    recipe = importlib.import_module(TASKS[task])
    prog = "hf-hybrid train" if task == DEFAULT_TASK else f"hf-hybrid train {TASK_FLAG} {task}"
    try:
        recipe.main(rest, prog=prog, epilog=_tasks_epilog())
    except DataError as exc:  # a data problem the user can fix: say so without a traceback
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _split_task(argv: list[str]) -> tuple[str, list[str]]:
    """`--task X` / `--task=X` taken out of `argv` (the recipes do not know it); default `causal_lm`."""
    for index, item in enumerate(argv):
        if item == TASK_FLAG or item.startswith(f"{TASK_FLAG}="):
            value = item.partition("=")[2] if "=" in item else (argv[index + 1 : index + 2] or [""])[0]
            if value not in TASKS:
                usage = f"hf-hybrid train [{TASK_FLAG} {{{','.join(TASKS)}}}] [--FIELD VALUE ...] | ARGS.yaml"
                print(f"usage: {usage}", file=sys.stderr)
                allowed = f"`{TASK_FLAG}` must be one of {list(TASKS)}, got {value!r}"
                print(f"hf-hybrid train: error: {allowed}", file=sys.stderr)
                raise SystemExit(2)
            return value, argv[:index] + argv[index + (1 if "=" in item else 2) :]
    return DEFAULT_TASK, argv


def _tasks_epilog() -> str:
    lines = [f"Tasks ({TASK_FLAG}, default {DEFAULT_TASK}; `hf-hybrid train {TASK_FLAG} TASK --help`):"]
    for task, module in TASKS.items():
        lines.append(f"  {task}: {importlib.import_module(module).SUPPORTS}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
