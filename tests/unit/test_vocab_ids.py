"""The active-vocabulary file (vocab_ids.py) and the corpus reader of vllm-hust-vspec-vocab:
one error naming the file and the field for each bad input."""

from __future__ import annotations

import json

import pytest

from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.tools import vocab
from vllm_hust_vspec.vocab_ids import FORMAT, load


def _write(tmp_path, **fields):
    doc = {"format": FORMAT, "version": 1, "ids": [5, 3, 9, 1], "counts": [4, 3, 2, 1], **fields}
    path = tmp_path / "ids.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_first_n_ids_in_rank_order(tmp_path):
    path = _write(tmp_path)
    assert load(path) == [5, 3, 9, 1]
    assert load(path, 2) == [5, 3]
    assert load(path, 4, vocab_size=10) == [5, 3, 9, 1]


@pytest.mark.parametrize(("fields", "size", "vocab", "says"), [
    ({"format": "other"}, 0, None, "format"),
    ({"version": 2}, 0, None, "version"),
    ({"ids": []}, 0, None, "non-empty list"),
    ({"ids": [1, "2"]}, 0, None, "non-empty list"),
    ({"ids": [1, True]}, 0, None, "non-empty list"),
    ({"ids": [1, -1]}, 0, None, "non-empty list"),
    ({"ids": [1, 1]}, 0, None, "repeat"),
    ({}, 5, None, "fewer than the 5"),
    ({}, 0, 9, "id 9 is outside the model's vocabulary of 9"),
])
def test_bad_files_name_the_field(tmp_path, fields, size, vocab, says):
    path = _write(tmp_path, **fields)
    with pytest.raises(VspecError, match=says) as err:
        load(path, size, vocab_size=vocab)
    assert str(path) in str(err.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(VspecError, match="no such file"):
        load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(VspecError, match="not a readable JSON file"):
        load(tmp_path / "bad.json")


def test_the_corpus_reader_takes_text_json_lines_and_sharegpt(tmp_path):
    (tmp_path / "a.txt").write_text("plain text")
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"prompt": "p", "output": "o", "other": "x"}) + "\n\n"
        + json.dumps({"conversations": [{"from": "human", "value": "v"}]}) + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "c"}]}) + "\n")
    assert list(vocab.texts(tmp_path / "a.txt")) == ["plain text"]
    assert list(vocab.texts(tmp_path / "b.jsonl")) == ["p", "o", "v", "c"]
    (tmp_path / "c.jsonl").write_text('{"n": 1}\n')
    with pytest.raises(vocab.VocabError, match=r"c.jsonl:1: no text field"):
        list(vocab.texts(tmp_path / "c.jsonl"))
    (tmp_path / "d.jsonl").write_text('{"prompt": "x"}\nnot json\n')
    with pytest.raises(vocab.VocabError, match=r"d.jsonl:2: invalid JSON"):
        list(vocab.texts(tmp_path / "d.jsonl"))


def test_ranking_puts_eos_and_bos_first_then_counts():
    class Tok:
        eos_token_id, bos_token_id = 2, 1

        def encode(self, text, add_special_tokens=False, verbose=True):
            return [int(c) for c in text]

    import pathlib
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d) / "c.txt"
        p.write_text("5553339")
        ids, counts, total = vocab.rank(Tok(), [p])
    assert ids == [2, 1, 3, 5, 9] and counts == [0, 0, 3, 3, 1] and total == 7
