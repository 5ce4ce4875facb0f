"""The arena (`hf-hybrid bench`): speed-up arithmetic, verdicts, methods as plug-ins, resume, the user's
own model and data, and every bad input refused before anything trains. No timing is asserted."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from hf_hybrid.bench import BenchTask, Protocol, run_arena
from hf_hybrid.bench.frontier import speedup
from hf_hybrid.bench.methods import Method, MethodError, parse_method, register_method, unregister_method
from hf_hybrid.bench.verdicts import judge, seed_band, speedups, verdicts
from hf_hybrid.data import DataError


def _run(method, seed, budget, units, loss, seconds=None, multiplier=1.0, role=None):
    return {
        "method": method,
        "seed": seed,
        "budget": budget,
        "units": units,
        "eval_loss": loss,
        "seconds": units / 10 if seconds is None else seconds,
        "lr_multiplier": multiplier,
        "role": role
        or (
            "sweep" if method == "plain" and budget == 1.0 else "frontier" if method == "plain" else "method"
        ),
    }


SEED0 = [
    _run("plain", 0, b, u, loss)
    for b, u, loss in ((0.25, 10, 3.0), (0.5, 20, 2.5), (0.75, 30, 2.2), (1.0, 40, 2.0))
]
SEED1 = [
    _run("plain", 1, b, u, loss)
    for b, u, loss in ((0.25, 10, 3.1), (0.5, 20, 2.6), (0.75, 30, 2.3), (1.0, 40, 2.1))
]


class TestSpeedupArithmetic:
    def test_a_method_is_read_off_its_seeds_plain_frontier(self):
        # plain needs 30 units to reach 2.2 (its 3/4 run); the method spent 20 -> 1.5x; time 3 s / 1 s
        method = _run("m", 0, 1.0, 20, 2.2, seconds=1.0)
        row = speedups(SEED0, method)
        assert row["speedup_units"] == pytest.approx(1.5)
        assert row["speedup_time"] == pytest.approx(3.0)
        assert row["final_loss_delta"] == pytest.approx(0.2)
        # between two budgets: 2.35 lies halfway from 2.5 (20) to 2.2 (30) -> 25 units
        assert speedups(SEED0, _run("m", 0, 1.0, 50, 2.35))["speedup_units"] == pytest.approx(0.5)

    def test_the_seed_band_is_how_far_plain_reads_from_one_on_another_seeds_frontier(self):
        # seed 1's full run (2.1) costs 35 units on seed 0's frontier: 35/40 = 0.875 -> band 0.125;
        # seed 0's full run (2.0) beats all of seed 1's frontier: a lower bound of 40/40 -> 0
        assert seed_band(SEED0 + SEED1, 1.0, (0, 1)) == pytest.approx(0.125)
        assert seed_band(SEED0, 1.0, (0,)) is None

    @pytest.mark.parametrize(
        ("values", "band", "verdict"),
        [
            ([1.5, 1.3], 0.125, "wins"),
            ([1.5, 1.1], 0.125, "ties"),  # one seed inside the band
            ([0.8, 0.7], 0.125, "loses"),
            ([0.95, 0.7], 0.125, "ties"),
            ([3.0], None, "ties"),  # one seed cannot show a win
            ([0.85], None, "loses"),
            ([0.95], None, "ties"),
        ],
    )
    def test_verdicts(self, values, band, verdict):
        assert judge([{"speedup_units": v} for v in values], band)[0] == verdict

    def test_a_verdict_takes_the_methods_best_rate_on_the_first_seed_and_its_median(self):
        runs = [
            *SEED0,
            *SEED1,
            _run("m", 0, 1.0, 20, 2.2, multiplier=1.0),
            _run("m", 0, 1.0, 20, 2.5, multiplier=2.0),
            _run("m", 1, 1.0, 20, 2.3, multiplier=1.0),
        ]
        plain, rows = verdicts(runs, ["m"], (0, 1))
        assert plain["best_lr_multiplier"] == 1.0 and plain["seed_band"] == pytest.approx(0.125)
        (m,) = [r for r in rows if r["method"] == "m"]
        assert m["lr_multiplier"] == 1.0 and m["seeds"] == [0, 1]
        assert m["speedup_units"] == pytest.approx(1.5)  # 30/20 on both seeds
        assert m["verdict"] == "wins"


# ---- a tiny arena end to end -----------------------------------------------------------------------

HYBRID = (
    "hybrid:warmup_steps=5,full_steps=2,confidence_threshold=0,min_history=3,max_predict_steps=4,"
    "check_every=0"
)
METHODS = [
    "plain",
    HYBRID,
    "null",
    "freeze:1",
    "selective-backprop:start=0,end=1,every=1",
    "dropbp:p=0.5",
    "bench_plugins:CountingTrainer",
    "bench_plugins:CountingCallback",
]
TINY = Protocol(
    seeds=(0, 1),
    lr_multipliers=(1.0, 2.0),
    method_lr_multipliers=(1.0,),
    widen=0,
    eval_points=2,
    warm_steps=1,
    timed_steps=2,
)


def _tiny_task():
    from hf_hybrid.bench.tasks import preset

    return preset("clm_stdlib", "tiny")


@pytest.fixture(scope="module")
def arena(tmp_path_factory):
    import bench_plugins

    out = tmp_path_factory.mktemp("arena")
    lines: list[str] = []
    run_arena(_tiny_task(), METHODS, TINY, out, echo=lines.append)
    data = json.loads((out / "results.json").read_text())
    return out, data, "\n".join(lines), bench_plugins


def test_the_arena_writes_its_record_report_and_plot(arena):
    out, data, printed, _ = arena
    assert (out / "report.md").read_text().count("| `") >= len(METHODS)
    assert (out / "arena.png").stat().st_size > 10_000
    assert "plan:" in printed and "Estimated" in printed
    assert len({r["key"] for r in data["runs"]}) == len(data["runs"])
    assert {r["role"] for r in data["runs"]} == {"sweep", "frontier", "method", "null"}
    judged = {v["method"] for v in data["verdicts"]}
    assert judged >= {"plain", HYBRID, "freeze:1", "dropbp:p=0.5", "bench_plugins:CountingTrainer"}
    assert any(m.startswith("null-hybrid") for m in judged)
    assert any(m.endswith("rule=uniform") for m in judged)  # selective backprop's null control


def test_the_verdicts_follow_from_the_runs_in_the_same_file(arena):
    _, data, _, _ = arena
    plain, rows = verdicts(
        data["runs"],
        [v["method"] for v in data["verdicts"][1:]],
        TINY.seeds,
        {v["method"]: v["null_control_of"] for v in data["verdicts"][1:] if v.get("null_control_of")},
    )
    assert rows == data["verdicts"] and plain == data["plain"]
    best = data["plain"]["best_lr_multiplier"]
    for row in data["verdicts"][1:]:
        for seed_row in row["per_seed"]:
            seed = seed_row["seed"]
            points = [
                r
                for r in data["runs"]
                if r["method"] == "plain" and r["seed"] == seed and r["lr_multiplier"] == best
            ]
            run = next(
                r
                for r in data["runs"]
                if r["method"] == row["method"]
                and r["seed"] == seed
                and r["lr_multiplier"] == row["lr_multiplier"]
            )
            expected = speedup(
                [(p["units"], p["eval_loss"]) for p in points], run["eval_loss"], run["units"]
            ).ratio
            assert seed_row["speedup_units"] == pytest.approx(expected)


def test_units_are_the_step_counts_priced_by_the_calibration(arena):
    _, data, _, _ = arena
    units = data["calibration"]["units"]
    assert units["forward"] == 1.0 and units["blind"] == 0.0 and units["step"] > 1.0
    for run in data["runs"]:
        assert run["units"] == pytest.approx(sum(n * units[k] for k, n in run["step_counts"].items()))
        assert sum(run["step_counts"].values()) == run["steps"]


def test_the_null_control_replays_the_hybrid_runs_phases_with_nothing_applied(arena):
    _, data, _, _ = arena
    hybrids = [r for r in data["runs"] if r["method"] == HYBRID]
    pairs = [(h, next(r for r in data["runs"] if r.get("replays") == h["key"])) for h in hybrids]
    assert pairs
    assert all(n["method"].startswith("null-hybrid") and n["seed"] == h["seed"] for h, n in pairs)
    assert all(n["details"]["phases"] == h["details"]["phases"] for h, n in pairs)
    assert all("predict" in h["details"]["phases"] for h, _ in pairs)
    assert all(n["step_counts"] == h["step_counts"] and n["step_counts"]["blind"] > 0 for h, n in pairs)


def test_a_users_trainer_subclass_and_callback_are_methods(arena):
    _, data, _, plugins = arena
    assert plugins.CountingTrainer.built >= 2  # calibration and the run
    assert plugins.CountingCallback.steps > 0
    counted = next(r for r in data["runs"] if r["method"] == "bench_plugins:CountingTrainer")
    assert counted["steps"] == _tiny_task().max_steps
    assert set(counted["step_counts"]) == {"bench_plugins:CountingTrainer:step"}


def test_the_other_seeds_run_only_for_methods_near_winning(arena):
    _, data, _, _ = arena
    rows = [v for v in data["verdicts"][1:] if v.get("null_control_of") is None]
    assert len(rows) == len(METHODS) - 2  # every method but plain and null
    expected = {v["method"]: [0, 1] if v["per_seed"][0]["speedup_units"] >= 0.9 else [0] for v in rows}
    assert {v["method"]: v["seeds"] for v in rows} == expected


def test_the_same_command_again_trains_nothing_and_keeps_the_calibration(arena, monkeypatch):
    out, data, _, _ = arena
    import hf_hybrid.bench.calibration as calibration
    import hf_hybrid.bench.protocol as protocol

    def refuse(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(protocol, "run_trial", refuse)
    monkeypatch.setattr(calibration, "_step_seconds", refuse)
    monkeypatch.setattr(calibration, "_forward_seconds", refuse)
    run_arena(_tiny_task(), METHODS, TINY, out, echo=lambda line: None)
    again = json.loads((out / "results.json").read_text())
    assert again["runs"] == data["runs"] and again["verdicts"] == data["verdicts"]


def test_a_record_of_another_task_is_refused(arena):
    out, _, _, _ = arena
    task = _tiny_task()
    task.max_steps = 12
    with pytest.raises(DataError, match=r"belongs to another task \(differs in \['max_steps'\]\)"):
        run_arena(task, ["plain"], TINY, out)


# ---- methods ---------------------------------------------------------------------------------------


class TestMethodSpecs:
    def test_options_positional_and_json_values(self):
        assert parse_method("freeze:3").k == 3
        assert parse_method("dropbp").p == 0.5
        hybrid = parse_method('hybrid:predictor=ema,predictor_kwargs={"beta": 0.8, "decay": 0.9}')
        assert hybrid.overrides["hybrid_predictor_kwargs"] == {"beta": 0.8, "decay": 0.9}
        assert parse_method("args:torch_compile=false,max_grad_norm=0.5").overrides == {
            "torch_compile": False,
            "max_grad_norm": 0.5,
        }

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            (
                "frobnicate",
                r"unknown method 'frobnicate'; methods: .*dropbp, freeze, hybrid.*selective-backprop",
            ),
            ("freeze:k=-1", r"'freeze:k=-1': `k` must be >= 0, got '-1'"),
            ("freeze", r"give the number of blocks, e.g. freeze:3"),
            ("dropbp:q=0.5", r"unknown option\(s\) \['q'\]; options: p \("),
            ("dropbp:p=1", r"`p` must be in \[0, 1\)"),
            ("selective-backprop:rule=best", r"`rule` must be one of \['loss', 'uniform'\]"),
            ("hybrid:warp=3", r"'hybrid:warp=3':.*FIELD one of"),
            ("hybrid:warmup_steps=-1", r"hybrid_warmup_steps"),
            ("args:no_such_field=1", r"'no_such_field' is not a TrainingArguments field"),
            ("bench_plugins:NOT_A_METHOD", r"neither a Trainer subclass, a TrainerCallback nor"),
            ("bench_plugins:Missing", r"module 'bench_plugins' has no attribute 'Missing'"),
            ("no_such_module.x:Y", r"cannot import module 'no_such_module.x'"),
            ("null", r"not run alone"),
        ],
    )
    def test_a_bad_spec_names_what_is_wrong(self, spec, message):
        with pytest.raises(MethodError, match=message):
            parse_method(spec)

    def test_a_registered_method_is_a_spec_and_a_builtin_cannot_be_shadowed(self):
        class Halved(Method):
            name = "halved-plain"
            summary = "test"

        register_method(Halved)
        try:
            assert isinstance(parse_method("halved-plain"), Halved)
        finally:
            unregister_method("halved-plain")
        Halved.name = "freeze"
        with pytest.raises(ValueError, match="'freeze' is a built-in method"):
            register_method(Halved)


class TestBlocks:
    def test_blocks_and_input_side_of_gpt2_bert_llama_and_peft(self):
        from peft import LoraConfig, get_peft_model
        from transformers import (
            BertConfig,
            BertModel,
            GPT2Config,
            GPT2LMHeadModel,
            LlamaConfig,
            LlamaForCausalLM,
        )

        from hf_hybrid.bench.methods.blocks import find_blocks, input_side

        gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=16, n_head=2, vocab_size=64, n_positions=32))
        bert = BertModel(
            BertConfig(
                num_hidden_layers=2,
                hidden_size=16,
                num_attention_heads=2,
                intermediate_size=32,
                vocab_size=64,
            )
        )
        llama = LlamaForCausalLM(
            LlamaConfig(
                num_hidden_layers=2,
                hidden_size=16,
                num_attention_heads=2,
                num_key_value_heads=2,
                intermediate_size=32,
                vocab_size=64,
            )
        )
        lora = get_peft_model(
            GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=32)),
            LoraConfig(target_modules=["c_attn"], r=2),
        )
        cases = [
            (gpt2, "transformer.h", 3, {gpt2.transformer.wte, gpt2.transformer.wpe}),
            (bert, "encoder.layer", 2, {bert.embeddings}),
            (llama, "model.layers", 2, {llama.model.embed_tokens}),
            (lora, "base_model.model.transformer.h", 2, None),
        ]
        found = [(model, *find_blocks(model)) for model, *_ in cases]
        assert [(name, len(blocks)) for _, name, blocks in found] == [
            (name, count) for _, name, count, _ in cases
        ]
        sides = [
            (side, set(input_side(model, name)))
            for (model, name, _), (*_, side) in zip(found, cases, strict=True)
        ]
        assert all(expected <= got for expected, got in sides if expected is not None)
        assert input_side(lora, "base_model.model.transformer.h")  # the peft-wrapped GPT-2's wte, wpe, drop

    def test_a_model_without_blocks_is_refused_with_its_class_named(self):
        from hf_hybrid.bench.methods.freeze import params_to_freeze

        with pytest.raises(MethodError, match="cannot find the transformer blocks of Linear"):
            params_to_freeze(torch.nn.Linear(2, 2), 1)

    def test_freeze_stops_the_backward_below_the_kth_block(self):
        from transformers import GPT2Config, GPT2LMHeadModel

        from hf_hybrid.bench.methods.freeze import freeze_bottom

        model = GPT2LMHeadModel(
            GPT2Config(
                n_layer=3, n_embd=16, n_head=2, vocab_size=64, n_positions=32, tie_word_embeddings=False
            )
        )
        freeze_bottom(model, 2)
        frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
        assert {"transformer.wte.weight", "transformer.wpe.weight"} <= frozen
        assert all(n.startswith(("transformer.h.0.", "transformer.h.1.", "transformer.w")) for n in frozen)
        assert all(p.requires_grad for n, p in model.named_parameters() if n.startswith("transformer.h.2."))
        with pytest.raises(MethodError, match="has 3 blocks; k must be <= 3"):
            parse_method("freeze:4").check_model(model)


def test_dropbp_skips_a_dropped_blocks_backward_and_passes_the_gradient_on():
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_hybrid.bench.methods.blocks import find_blocks
    from hf_hybrid.bench.methods.dropbp import BlockDropper

    torch.manual_seed(0)
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=3, n_embd=16, n_head=2, vocab_size=64, n_positions=32, **no_dropout)
    )
    ids = torch.randint(0, 64, (2, 8))
    reference = model(input_ids=ids).logits.detach()
    dropper = BlockDropper(find_blocks(model)[1], p=0.5, seed=0)
    dropper.dropped = [False, True, False]
    out = model(input_ids=ids, labels=ids)
    assert torch.allclose(out.logits, reference, atol=1e-6)  # the forward is unchanged
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is None for n, g in grads.items() if n.startswith("transformer.h.1."))
    assert all(
        g is not None and g.abs().sum() > 0 for n, g in grads.items() if n.startswith("transformer.h.0.attn")
    )
    draws = []
    for _ in range(200):
        dropper.draw()
        draws.append(sum(dropper.dropped))
    assert 0.4 < sum(draws) / (3 * len(draws)) < 0.6
    assert max(draws) == 2  # never all three: with frozen embeddings that step would have no gradient


def test_selective_backprop_keeps_the_share_asked_for_and_its_null_draws_uniformly():
    method = parse_method("selective-backprop:keep=0.25")
    null = parse_method(method.null_spec())
    assert null.rule == "uniform" and null.null_spec() is None
    losses = torch.arange(16, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    picks = torch.cat([method.pick(losses, generator) for _ in range(200)])
    assert len(method.pick(losses, generator)) == 4
    assert picks.float().mean() > 10  # rank-weighted: the high-loss samples are drawn far more often
    uniform = torch.cat([null.pick(losses, generator) for _ in range(200)])
    assert 6.5 < uniform.float().mean() < 8.5


# ---- the user's own model and data ----------------------------------------------------------------


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """A local model directory (tiny BERT, MiniLM's tokenizer) and a CSV with string labels."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from hf_hybrid.bench.tasks import minilm_path
    from hf_hybrid.data import stdlib_package_snippets

    root = tmp_path_factory.mktemp("user")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    )
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    train, _, names = stdlib_package_snippets(
        chars=96, train_per_label=12, eval_per_label=2, packages=("email", "xml", "http")
    )
    with open(root / "my.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "y"])
        writer.writerows([t, names[label]] for t, label in zip(train["text"], train["label"], strict=True))
    (root / "empty.csv").write_text("text,y\n")
    (root / "my.tsv").write_text("text\ty\n")
    return root


def _options(root, **changes):
    from hf_hybrid.bench.user_task import UserTaskOptions

    values = {
        "model_name_or_path": str(root / "model"),
        "dataset": str(root / "my.csv"),
        "task": "sequence_classification",
        "label_column": "y",
        "max_steps": 4,
        "max_length": 32,
        "per_device_train_batch_size": 4,
    }
    return UserTaskOptions(**{**values, **changes})


def test_a_users_csv_and_local_model_run_through_the_arena(user_files, tmp_path):
    from hf_hybrid.bench.user_task import build_user_task

    task = build_user_task(_options(user_files), tmp_path)
    assert json.loads((tmp_path / "labels.json").read_text())["id2label"] == {
        "0": "email",
        "1": "http",
        "2": "xml",
    }
    assert len(task.evaluation) == math.ceil(0.15 * 36) and set(task.train["labels"]) == {0, 1, 2}
    protocol = Protocol(
        lr_multipliers=(1.0,),
        method_lr_multipliers=(1.0,),
        widen=0,
        eval_points=1,
        warm_steps=1,
        timed_steps=1,
    )
    run_arena(task, ["plain", "freeze:1"], protocol, tmp_path, echo=lambda line: None)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["task"]["labels"] == ["email", "http", "xml"]
    assert [v["method"] for v in data["verdicts"]] == ["plain", "freeze:1"]
    assert all(math.isfinite(r["eval_loss"]) for r in data["runs"])


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if anything trains or calibrates."""
    import hf_hybrid.bench.calibration as calibration
    import hf_hybrid.bench.protocol as protocol

    def refuse(*args, **kwargs):
        raise AssertionError("trained before the bad input was refused")

    monkeypatch.setattr(protocol, "run_trial", refuse)
    monkeypatch.setattr(calibration, "_forward_seconds", refuse)
    monkeypatch.setattr(calibration, "_step_seconds", refuse)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_name_or_path": "./no/such/model"}, r"`--model_name_or_path` ./no/such/model does not exist"),
        (
            {"text_column": "body"},
            r"`--text_column` 'body' is not a column of .*my.csv; its columns: \['text', 'y'\]",
        ),
        (
            {"label_column": "label"},
            r"`--label_column` 'label' is not a column of .*; its columns: \['text', 'y'\]",
        ),
        ({"dataset": "EMPTY"}, r"empty.csv is empty \(0 rows\)"),
        ({"dataset": "no_such.csv"}, r"`--dataset` no_such.csv does not exist"),
        ({"dataset": "TSV"}, r"a file must end in one of \['.csv', '.json', '.jsonl', '.txt'\]"),
        ({"task": "regression"}, r"`--task` must be one of \['causal_lm', 'sequence_classification'\]"),
    ],
)
def test_bad_data_and_model_inputs_are_refused_before_training(
    user_files, tmp_path, no_training, changes, message
):
    from hf_hybrid.bench.user_task import build_user_task

    paths = {
        "EMPTY": str(user_files / "empty.csv"),
        "TSV": str(user_files / "my.tsv"),
    }
    changes = {k: paths.get(v, v) for k, v in changes.items()}
    with pytest.raises(DataError, match=message):
        build_user_task(_options(user_files, **changes), tmp_path)


def test_a_bad_method_or_budget_is_refused_before_training(user_files, tmp_path, no_training):
    from hf_hybrid.bench.user_task import build_user_task

    task = build_user_task(_options(user_files), tmp_path)
    with pytest.raises(MethodError, match="unknown method 'frobnicate'; methods: "):
        run_arena(task, ["plain", "frobnicate"], Protocol(), tmp_path)
    task.max_steps = 3
    with pytest.raises(DataError, match=r"`--max_steps` 3 is too small for the plain frontier.*>= 4"):
        run_arena(task, ["plain"], Protocol(), tmp_path)
    task.max_steps = 8
    with pytest.raises(MethodError, match=r"BertForSequenceClassification has 2 blocks; k must be <= 2"):
        run_arena(task, ["plain", "freeze:5"], Protocol(), tmp_path)
    with pytest.raises(DataError, match="`null` adds the null control of the other methods listed, and none"):
        run_arena(task, ["plain", "freeze:1", "null"], Protocol(), tmp_path)


def test_the_command_line_prints_one_error_line_for_a_bad_input(user_files, tmp_path, capsys, no_training):
    from hf_hybrid.cli import main

    code = main(
        [
            "bench",
            "--model_name_or_path",
            str(user_files / "model"),
            "--dataset",
            str(user_files / "my.csv"),
            "--task",
            "sequence_classification",
            "--label_column",
            "z",
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        f"hf-hybrid bench: error: `--label_column` 'z' is not a column of {user_files / 'my.csv'}; "
        "its columns: ['text', 'y']"
    ]


def test_list_methods_describes_every_method(capsys):
    from hf_hybrid.cli import main

    assert main(["bench", "--list_methods"]) == 0
    out = capsys.readouterr().out
    for name in (
        "plain",
        "hybrid",
        "hybrid-predict",
        "null",
        "freeze",
        "selective-backprop",
        "dropbp",
        "args",
    ):
        assert f"  {name}: " in out


def test_a_task_factory_returns_a_bench_task(tmp_path, monkeypatch):
    import argparse

    from hf_hybrid.bench_cli import add_bench_parser, task_from_factory

    parser = argparse.ArgumentParser()
    bench = add_bench_parser(parser.add_subparsers())
    args = bench.parse_args(["--task_factory", "test_arena:_tiny_task", "--max_steps", "8"])
    task = task_from_factory(args)
    assert isinstance(task, BenchTask) and task.max_steps == 8
    args = bench.parse_args(["--task_factory", "bench_plugins:CountingCallback"])
    with pytest.raises(DataError, match="must be a function returning a hf_hybrid.bench.BenchTask"):
        task_from_factory(args)


def test_a_method_subclass_by_import_path_takes_options_and_prices_its_own_kinds(tmp_path):
    """The adaptive-freezing experiment is an arena plug-in: each frozen-prefix length is a kind of step,
    priced by freezing that prefix from the start."""
    spec = "benchmarks.experiments.adaptive_freeze:AdaptiveFreeze:signal=update,every=2,ref=1,tau=100"
    method = parse_method(spec)
    assert (method.signal, method.every, method.tau) == ("update", 2, 100.0)
    with pytest.raises(MethodError, match=r"`signal` must be one of \['update', 'plateau', 'gradnorm'\]"):
        parse_method(spec.replace("signal=update", "signal=loss"))
    protocol = Protocol(
        lr_multipliers=(1.0,),
        method_lr_multipliers=(1.0,),
        widen=0,
        eval_points=1,
        warm_steps=1,
        timed_steps=1,
    )
    run_arena(_tiny_task(), ["plain", spec], protocol, tmp_path, echo=lambda line: None)
    data = json.loads((tmp_path / "results.json").read_text())
    run = next(r for r in data["runs"] if r["method"] == spec)
    assert run["details"]["frozen_at"]  # tau=100: every window is "below", so it freezes at once
    frozen_kinds = [k for k in run["step_counts"] if k.startswith(f"{spec}:frozen")]
    assert frozen_kinds and all(k in data["calibration"]["units"] for k in frozen_kinds)
    assert data["calibration"]["units"][f"{spec}:frozen1"] < data["calibration"]["units"]["step"] * 1.5
