"""The built-in tasks' eval sets: held-out chunks of the documents trained on, clustered by document."""

from __future__ import annotations

import pytest

from hf_hybrid.data import DataError, held_out_chunks


def _documents(sizes: list[int]) -> list[list[tuple[int, int]]]:
    return [[(d, i) for i in range(n)] for d, n in enumerate(sizes)]


def test_every_eval_item_comes_from_a_document_that_also_trains_and_clusters_by_document():
    documents = _documents([3, 10, 1, 25, 7, 40, 2, 30])
    train, evaluation, clusters = held_out_chunks(documents, 60, 20, chunk=2, every=3)
    assert len(train) == 60 and len(evaluation) == len(clusters) == 20
    assert not set(train) & set(evaluation)
    assert [doc for doc, _ in evaluation] == clusters  # a cluster is the eval item's document
    assert set(clusters) <= {doc for doc, _ in train}


def test_a_document_reached_after_the_training_set_is_full_gives_no_eval():
    """The old pass went on collecting eval chunks from documents the training set never reached (41% of
    the MiniLM tasks' eval snippets): now the eval set must fit in the documents trained on."""
    documents = _documents([12, 12, 12, 12])
    with pytest.raises(DataError, match="fewer than 10: hold out more than one chunk in 6"):
        held_out_chunks(documents, train_wanted=10, eval_wanted=10, chunk=2, every=6)
