"""The variable-length instruction task: signature -> docstring pairs from files the decoder never saw, the
response scored, held out by file, padded per batch and priced per token."""

from __future__ import annotations

from hf_hybrid.bench import instruct
from hf_hybrid.bench.decoder import TINY_RECIPE, pretraining_blocks
from hf_hybrid.bench.instruct import Pair, docstring_pairs, encode, unseen_files
from hf_hybrid.bench.methods.base import prices_tokens
from hf_hybrid.bench.methods.packing import PadToLongest, length_spread
from hf_hybrid.data import stdlib_source_files

SOURCE = '''
class Store(dict, metaclass=Meta):
    """A store.

    More about it."""

    async def fetch(self, key: str, *, default=None) -> bytes:
        """Fetch one key."""

def bare(x):
    return x
'''


def test_pairs_are_a_signature_and_its_docstrings_first_paragraph(tmp_path):
    path = tmp_path / "store.py"
    path.write_text(SOURCE)
    pairs = docstring_pairs(path, "store.py")
    assert [(p.prompt, p.response) for p in pairs] == [
        (b"class Store(dict, metaclass=Meta):\n", b"A store."),
        (b"async def fetch(self, key: str, *, default=None) -> bytes:\n", b"Fetch one key."),
    ]


def test_an_example_scores_its_response_and_is_cut_at_the_maximum_length():
    pair = Pair(b"def f(x):\n", b"Return x, unchanged, always.", "m.py")
    example = encode(pair, 64)
    assert example["input_ids"] == [*b"def f(x):\n", *b"Return x, unchanged, always.", instruct.EOS]
    assert example["labels"] == [-100] * 10 + example["input_ids"][10:]
    cut = encode(pair, 24)
    assert cut["input_ids"] == example["input_ids"][:24] and cut["labels"] == example["labels"][:24]
    assert encode(pair, 20) is not None and encode(pair, 19) is None  # a 10-byte prompt needs 20: room left


def test_the_files_the_decoder_read_in_pretraining_are_left_out():
    blocks = pretraining_blocks(TINY_RECIPE)
    unseen = unseen_files(TINY_RECIPE)
    read = [p for p in stdlib_source_files() if p not in set(unseen)]
    assert read and unseen and read[-1] < unseen[0]
    assert bytes(blocks[-1]) in read[-1].read_bytes()  # the file pretraining stopped in counts as read
    assert unseen_files()[0] > unseen[0]  # the default decoder read further


def test_the_preset_holds_out_examples_of_the_files_it_trains_on_padded_per_batch_priced_per_token():
    from hf_hybrid.bench.tasks import preset

    task = preset("instruct_docstrings", "tiny")
    assert isinstance(task.data_collator, PadToLongest) and prices_tokens(task)
    assert not prices_tokens(preset("clm_stdlib", "tiny"))
    assert all(len(ids) <= 32 for ids in task.train["input_ids"])
    assert all(labels[0] == -100 for labels in task.train["labels"])
    assert len(task.eval_clusters) == len(task.evaluation) and len(set(task.eval_clusters)) > 1
    documents = instruct.instruct_split(instruct_size("tiny"))[3]
    assert sorted(set(task.eval_clusters)) == list(range(len(documents)))
    trained_files = instruct.instruct_split(instruct_size("tiny"))[4]
    assert set(documents) <= trained_files  # no file only in eval


def test_the_full_size_has_a_long_tail_of_lengths():
    size = instruct_size("full")
    train, evaluation, clusters, *_ = instruct.instruct_split(size)
    assert len(train) == size.train_examples >= size.steps * size.batch_size  # at most one epoch
    lengths = [len(ids) for ids in train["input_ids"]]
    spread = length_spread(lengths, size.batch_size)
    assert spread.quantiles["p50"] < 0.75 * size.seq_len and spread.quantiles["max"] == size.seq_len
    assert spread.padding_share > 0.15  # what packing can remove


def instruct_size(name: str):
    from hf_hybrid.bench.tasks import get_task

    return get_task("instruct_docstrings").size(name)
