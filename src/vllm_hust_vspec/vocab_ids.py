"""The active-vocabulary file: token ids ranked by a corpus's counts, read and checked.

``vllm-hust-vspec-vocab`` (``tools/vocab.py``) writes it; the drafter's LM head then
computes only its first N ids (``runtime/draft_lm_head.py``).  The format::

    {"format": "vllm-hust-vspec-active-vocab", "version": 1,
     "tokenizer": "...", "vocab_size": 4096, "corpus": ["code.jsonl", ...],
     "tokens_counted": 123456, "ids": [ranked ids, most frequent first], "counts": [...]}

Errors are :class:`~.errors.VspecError` naming the file and the field.
"""

from __future__ import annotations

import json
import pathlib

from vllm_hust_vspec.errors import VspecError

FORMAT = "vllm-hust-vspec-active-vocab"
VERSION = 1


def load(path: str | pathlib.Path, size: int = 0, vocab_size: int | None = None) -> list[int]:
    """The first ``size`` ids of the file (all with 0), checked: distinct integers in
    ``[0, vocab_size)`` (when the model's vocabulary is known)."""
    src = str(path)
    try:
        doc = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise VspecError(src, "path", "no such file (write one with vllm-hust-vspec-vocab)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VspecError(src, "path", f"not a readable JSON file: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise VspecError(src, "format", f"expected {FORMAT!r} (written by vllm-hust-vspec-vocab)")
    if doc.get("version") != VERSION:
        raise VspecError(src, "version", f"expected {VERSION}, got {doc.get('version')!r}")
    ids = doc.get("ids")
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
        raise VspecError(src, "ids", "expected a non-empty list of token ids (integers >= 0)")
    if len(set(ids)) != len(ids):
        raise VspecError(src, "ids", "token ids repeat")
    if size > len(ids):
        raise VspecError(src, "ids", f"holds {len(ids)} ids, fewer than the {size} asked for")
    chosen = ids[:size] if size else ids
    if vocab_size is not None and max(chosen) >= vocab_size:
        raise VspecError(src, "ids", f"id {max(chosen)} is outside the model's vocabulary of "
                         f"{vocab_size} tokens (a file for another tokenizer?)")
    return chosen
