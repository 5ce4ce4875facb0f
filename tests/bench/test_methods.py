"""The arena's methods as plug-ins: specs and their refusals, blocks found without knowing the family,
and what freezing, DropBP and selective backprop do to a step."""

from __future__ import annotations

import pytest
import torch

from hf_hybrid.bench.methods import Method, MethodError, parse_method, register_method, unregister_method

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
                r"unknown method 'frobnicate'; methods: .*dropbp, freeze, .*packing.*selective-backprop",
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
