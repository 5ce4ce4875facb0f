"""`hf-hybrid bench`'s flags (named as in `run_clm.py`) and dispatch; light: nothing heavy at the top."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from .bench import protocol as rules
from .data import DataError

SUITE_CHOICES = ("tiny", "quick", "full")
TASK_TYPES = ("causal_lm", "sequence_classification")
PROTOCOL_FLAGS = dict(widen="widen", cooldown_fraction="cooldown", decay_shape="decay", schedule="schedule")


def add_bench_parser(sub: Any) -> argparse.ArgumentParser:
    bench = sub.add_parser(
        "bench",
        allow_abbrev=False,
        help="does a method make your fine-tune cheaper at the same eval loss? The plain Trainer (lr tuned, "
        "frontier of budgets) against every method you list, on your model and data",
        description="The arena: trains your task with the plain transformers.Trainer (one "
        "warmup-stable-decay trunk per learning rate, a cooldown branch at 1/4, 1/2 and 3/4 of the budget, "
        "the rates raced by successive halving, so each budget has its own tuned rate) and with each method "
        "on the same schedule, and reads each method's speed-up at equal eval loss off the plain frontier, "
        "in compute units and time, with a verdict (wins / ties / loses) against the plain runs' seed noise. "
        "Writes results.json, report.md and arena.png to --out; the same command again resumes.",
        epilog="Methods: plain, hybrid[:field=value,...], hybrid-predict, null (adds each method's null "
        "control), freeze:k, selective-backprop[:keep=0.5,...], dropbp[:p=0.5], peft:lora, "
        "args:field=value,..., module.path:Name (a Trainer subclass or TrainerCallback). `--list_methods` "
        "describes them.",
    )
    for add in (_task_flags, _judged_flags, _protocol_flags, _scaling_flags, _tool_flags):
        add(bench)
    return bench


def _task_flags(bench: argparse.ArgumentParser) -> None:
    task = bench.add_argument_group("your task")
    task.add_argument("--model_name_or_path", help="a local directory (save_pretrained) or a Hub id")
    task.add_argument("--dataset", help="CSV, JSON lines, plain text (causal_lm) or a save_to_disk folder")
    task.add_argument("--eval_dataset", help="the eval set (default: --eval_fraction of --dataset held out)")
    task.add_argument(
        "--eval_fraction", type=float, default=0.15, help="held out for eval (default: %(default)s)"
    )
    task.add_argument("--task", choices=TASK_TYPES, default="causal_lm", help="default: %(default)s")
    task.add_argument("--text_column", default="text", help="default: %(default)s")
    task.add_argument(
        "--label_column", default="label", help="sequence_classification (default: %(default)s)"
    )
    task.add_argument("--peft", choices=("none", "lora"), default="none", help="default: %(default)s")
    task.add_argument("--lora_r", type=int, default=8, help="LoRA rank, alpha = 2r (default: %(default)s)")
    task.add_argument(
        "--max_length", type=int, default=128, help="tokens per example/block (default: %(default)s)"
    )
    task.add_argument("--max_train_samples", type=int, help="use at most this many training rows")
    task.add_argument("--max_eval_samples", type=int, help="use at most this many eval rows")
    task.add_argument(
        "--lm_examples",
        choices=("blocks", "rows"),
        default="blocks",
        help="causal_lm: the text concatenated and cut into blocks of --max_length, or each row one example "
        "padded per batch (what packing and group_by_length work on) (default: %(default)s)",
    )
    task.add_argument(
        "--prompt_column",
        help="causal_lm: each row a prompt (its labels -100) and its --text_column answer (implies rows)",
    )
    task.add_argument(
        "--eval_group_column",
        help="the eval rows' file or document: rows that share it move together in the eval noise "
        "(default: each row on its own, which understates the noise of rows cut from one document)",
    )
    task.add_argument("--task_factory", metavar="MODULE:FUNCTION", help="a function returning a BenchTask")
    budget = bench.add_argument_group("budget (your task; a preset has its own)")
    budget.add_argument("--max_steps", type=int, help="optimizer steps of a full run (default: 200)")
    budget.add_argument("--per_device_train_batch_size", type=int, help="default: 8")
    budget.add_argument("--per_device_eval_batch_size", type=int, help="default: 32")
    budget.add_argument(
        "--learning_rate",
        type=float,
        help="the plain sweep's centre (default: set by a learning-rate range test on your task)",
    )


def _protocol_flags(bench: argparse.ArgumentParser) -> None:
    protocol = bench.add_argument_group("protocol")
    protocol.add_argument(
        "--lr_multipliers",
        nargs="+",
        type=float,
        help="every race's first rates (plain's and each method's), x its centre, x2 apart "
        f"(default: {' '.join(f'{r:g}' for r in rules.FIRST_RATES)}; widened at an edge)",
    )
    protocol.add_argument(
        "--widen",
        type=int,
        help=f"rates a race may add beyond its first ones, per side (default: {rules.MAX_WIDENINGS})",
    )
    protocol.add_argument(
        "--cooldown_fraction",
        type=float,
        help=f"each budget's decay, as a fraction of its steps, in (0, 0.5] (default: {rules.COOLDOWN:g})",
    )
    protocol.add_argument(
        "--decay_shape",
        choices=("1-sqrt", "linear", "cosine"),
        help=f"the cooldown's shape (default: {rules.DECAY})",
    )
    protocol.add_argument(
        "--schedule",
        choices=("wsd", "separate"),
        help="wsd: one trunk per rate with cooldown branches (checked once against the task's own "
        "schedule); separate: a complete run per budget with the task's own schedule (default: wsd)",
    )


def _judged_flags(bench: argparse.ArgumentParser) -> None:
    judged = bench.add_argument_group("what to judge")
    judged.add_argument(
        "--methods", nargs="+", metavar="METHOD", help="methods to judge (default: plain hybrid null)"
    )
    judged.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        help="the first for everything; the others for plain's frontiers and for methods whose verdict "
        "they can change (default: 0)",
    )
    judged.add_argument("--out", help="output folder (default: bench_results/<task>)")
    judged.add_argument(
        "--fresh",
        action="store_true",
        help="move a record of an earlier protocol aside (results.v1.json) and start over",
    )
    judged.add_argument("--list_methods", action="store_true", help="describe every method and exit")


def _scaling_flags(bench: argparse.ArgumentParser) -> None:
    """Who runs the runs (local workers or Ray), and the built-in presets."""
    scale = bench.add_argument_group("scaling out")
    scale.add_argument(
        "--workers",
        type=int,
        help="runs at a time, each in its own process: one GPU each, or a share of the CPU cores "
        "(default: one run at a time in this process)",
    )
    scale.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        metavar="ADDRESS",
        help="run each run as a Ray task: auto (the cluster this machine belongs to), local (start one here) "
        "or HOST:PORT / ray://HOST:PORT (needs pip install 'hf-hybrid[ray]')",
    )
    presets = bench.add_argument_group("built-in presets")
    presets.add_argument("--suite", choices=SUITE_CHOICES, help="preset size and tasks (default: quick)")
    presets.add_argument("--tasks", nargs="+", help="a subset of the suite's tasks, or other presets")
    presets.add_argument(
        "--hybrid",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a hybrid_* argument for the `hybrid` method (repeatable), e.g. --hybrid hybrid_predictor=adam",
    )


def _tool_flags(bench: argparse.ArgumentParser) -> None:
    """The measuring tools instead of the arena: overhead and faults."""
    overhead = bench.add_argument_group("overhead")
    overhead.add_argument(
        "--overhead",
        action="store_true",
        help="measure instead what the engine costs: alternating plain/hybrid pairs of each "
        "preset task at the suite's size, and the engine's retained memory while asleep",
    )
    overhead.add_argument("--pairs", type=int, default=3, help="pairs per task with --overhead (default: 3)")
    overhead.add_argument(
        "--awake",
        action="store_true",
        help="with --overhead: the hybrid runs predict (null predictor, threshold 0; --hybrid overrides "
        "win) and the report is the hybrid machinery's share of the step time, per part",
    )
    faults = bench.add_argument_group("faults")
    faults.add_argument(
        "--faults",
        nargs="*",
        metavar="FAULT",
        help="measure instead what a loss spike costs: each method (default: plain and the hybrid trainer "
        "with its spike guard on) clean and with each fault injected at mid-run (default: lr_burst garbage "
        "shuffled_labels; the controls skip_clean_2 skip_clean_5 skip the optimizer step of as many clean "
        "batches, what the guard's skip costs by itself; replay_clean_2 replay_clean_5 train those steps on "
        "the clean batches just before them again), seeds 0 1 2 unless --seeds, at the task's learning "
        "rate unless --learning_rate",
    )
    faults.add_argument(
        "--fault_eval_points",
        type=int,
        default=1,
        metavar="N",
        help="with --faults: evaluate N times per run (default 1, at the end) and also read each fault where "
        "the clean plain run's eval loss is lowest (for a task that overfits by the end)",
    )


def bench_main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run what the flags ask for; a problem the user can fix is one error line, exit code 2."""
    try:
        return _dispatch(args)
    except ValueError as exc:  # DataError and MethodError are ValueErrors
        methods = sys.modules.get("hf_hybrid.bench.methods.base")  # a MethodError needs them imported
        if not isinstance(exc, DataError) and (methods is None or not isinstance(exc, methods.MethodError)):
            raise
        print(f"hf-hybrid bench: error: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    if os.getcwd() not in sys.path:  # `module.path:Name` methods and task factories from the user's folder
        sys.path.insert(0, os.getcwd())
    from .bench.precheck import check_light

    check_light(args)  # before anything heavy is imported or read: a misspelt method is refused at once
    from .bench.arena import parse_methods
    from .bench.run import SUITES
    from .bench.runner import quiet_libraries

    if args.list_methods:
        print(_methods_text())
        return 0
    quiet_libraries()
    methods = _methods(args)
    own = args.model_name_or_path is not None or args.task_factory is not None or args.dataset is not None
    suite = SUITES[args.suite or "quick"]
    if args.overhead:
        return _overhead(args, suite)
    parse_methods(methods)  # every spec read as the arena will, still before the data
    if args.faults is not None:
        return _faults(args, own, suite)
    if own:
        if args.suite or args.tasks:
            raise DataError(
                "give either your task (--model_name_or_path/--dataset or --task_factory) or presets "
                "(--suite/--tasks), not both"
            )
        task = _own_task(args)
        _arena(
            args, task, methods, _protocol_fields(args, seeds=(0,)), args.out or f"bench_results/{task.name}"
        )
        return 0
    from .bench.recipe import build_task, preset_recipe

    for name in args.tasks or suite["tasks"]:
        overrides = {"max_steps": args.max_steps} if args.max_steps is not None else {}
        try:
            task = build_task(preset_recipe(name, suite["size"], overrides))
        except ValueError as exc:
            raise DataError(str(exc)) from None
        fields = _protocol_fields(
            args, seeds=suite["seeds"], lr_multipliers=suite["lr_multipliers"], widen=suite["widen"]
        )
        out = f"{args.out}/{name}" if args.out else f"bench_results/{args.suite or 'quick'}/{name}"
        _arena(args, task, methods, fields, out)
    return 0


def _arena(args: argparse.Namespace, task: Any, methods: list[str], fields: dict[str, Any], out: str) -> None:
    from .bench.run import run_arena

    protocol = rules.Protocol(**fields)
    use_ray = args.ray is not None
    run_arena(
        task, methods, protocol, out, workers=args.workers, ray=args.ray, use_ray=use_ray, fresh=args.fresh
    )


def _methods(args: argparse.Namespace) -> list[str]:
    from .bench.overrides import parse_hybrid_overrides
    from .bench.run import DEFAULT_METHODS

    methods = list(args.methods or DEFAULT_METHODS)
    if args.hybrid:
        try:
            overrides = parse_hybrid_overrides(args.hybrid)
        except ValueError as exc:
            raise DataError(str(exc)) from None
        options = ",".join(f"{k}={v}" for k, v in overrides.items())
        methods = [f"hybrid:{options}" if m == "hybrid" else m for m in methods]
    return methods


def _protocol_fields(args: argparse.Namespace, **defaults: Any) -> dict[str, Any]:
    fields = dict(defaults)
    for flag in ("seeds", "lr_multipliers"):
        if getattr(args, flag) is not None:
            fields[flag] = tuple(getattr(args, flag))
    for flag, name in PROTOCOL_FLAGS.items():
        if getattr(args, flag) is not None:
            fields[name] = getattr(args, flag)
    return fields


def _own_task(args: argparse.Namespace) -> Any:
    from .bench.user_task import UserTaskOptions, build_user_task

    if args.task_factory is not None:
        return task_from_factory(args)
    if args.model_name_or_path is None or args.dataset is None:
        raise DataError("your task needs both --model_name_or_path and --dataset")
    options = {field.name: getattr(args, field.name) for field in dataclasses.fields(UserTaskOptions)}
    options["max_steps"] = args.max_steps if args.max_steps is not None else 200
    options["per_device_train_batch_size"] = args.per_device_train_batch_size or 8
    options["per_device_eval_batch_size"] = args.per_device_eval_batch_size or 32
    return build_user_task(UserTaskOptions(**options))


def task_from_factory(args: argparse.Namespace) -> Any:
    from .bench.methods.specs import import_object
    from .bench.recipe import factory_recipe
    from .bench.task import BenchTask

    factory = import_object(args.task_factory)
    task = factory() if callable(factory) else None
    if not isinstance(task, BenchTask):
        raise DataError(
            f"`--task_factory` {args.task_factory} must be a function returning a hf_hybrid.bench.BenchTask, "
            f"got {type(task).__name__}"
        )
    overrides = {}
    for flag, attr in (
        ("max_steps", "max_steps"),
        ("per_device_train_batch_size", "batch_size"),
        ("per_device_eval_batch_size", "eval_batch_size"),
        ("learning_rate", "learning_rate"),
    ):
        if getattr(args, flag) is not None:
            overrides[attr] = getattr(args, flag)
            setattr(task, attr, getattr(args, flag))
    task.recipe = factory_recipe(args.task_factory, overrides)
    return task


def _overhead(args: argparse.Namespace, suite: dict[str, Any]) -> int:
    from .bench.measure.overhead import run_overhead
    from .bench.overrides import parse_hybrid_overrides

    out = args.out or f"bench_results/overhead-{args.suite or 'quick'}"
    overrides = parse_hybrid_overrides(args.hybrid)
    run_overhead(args.tasks or suite["tasks"], suite["size"], args.pairs, out, overrides, awake=args.awake)
    return 0


def _faults(args: argparse.Namespace, own: bool, suite: dict[str, Any]) -> int:
    from .bench.measure.faults import FAULTS, GUARDED, run_faults
    from .bench.tasks import preset

    arms = _methods(args) if args.methods else ["plain", GUARDED]
    tasks = (
        [_own_task(args)] if own else [preset(name, suite["size"]) for name in args.tasks or suite["tasks"]]
    )
    for task in tasks:
        if args.max_steps is not None and not own:
            task.max_steps = args.max_steps
        try:
            run_faults(
                task,
                arms,
                args.faults or FAULTS,
                seeds=tuple(args.seeds or (0, 1, 2)),
                learning_rate=args.learning_rate,
                out=f"{args.out or 'bench_results/faults'}/{task.name}",
                eval_points=args.fault_eval_points,
            )
        except ValueError as exc:
            raise DataError(str(exc)) from None
    return 0


def _methods_text() -> str:
    from .bench.methods import describe_methods

    lines = ["Methods (spec: what it runs):"]
    lines += [f"  {name}: {summary}" for name, summary in describe_methods().items()]
    lines.append(
        "  module.path:Name: your own Trainer subclass or TrainerCallback, costed by timing its steps"
    )
    return "\n".join(lines)
