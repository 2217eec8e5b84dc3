"""``vllm-hust-vspec-vocab``: rank a tokenizer's ids by a corpus's counts, for an active
vocabulary of the drafter (``--draft-active-vocab-ids`` / ``--eagle-draft-active-vocab-ids``).

Each corpus file is tokenized with the model's tokenizer (no special tokens added): a
``.jsonl`` file contributes the strings of its ``prompt``, ``text``, ``completion``,
``output`` and ``response`` fields and of ShareGPT ``conversations`` / ``messages``
(``value`` / ``content``), any other file its whole text.  The ids are ranked by count (ties:
the smaller id), after the tokenizer's EOS and BOS ids, which always come first (a drafter
that cannot propose EOS guesses past the end of every answer).  ``--size N`` keeps the
first N.  The file (``vocab_ids.py`` reads it) records the corpus and how much of it the
kept ids cover; the run prints the coverage at a few sizes, which is what acceptance will
follow: a draft the target would not make is a lost position, not a wrong token.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
from collections.abc import Iterator, Sequence

from vllm_hust_vspec.fileio import write_atomic
from vllm_hust_vspec.tools.argtypes import positive_int
from vllm_hust_vspec.tools.bench_workloads import WorkloadError, jsonl_records
from vllm_hust_vspec.vocab_ids import FORMAT, VERSION

PROG = "vllm-hust-vspec-vocab"
TEXT_FIELDS = ("prompt", "text", "completion", "output", "response")
TURN_LISTS = ("conversations", "messages")
TURN_FIELDS = ("value", "content")


class VocabError(Exception):
    pass


def texts(path: pathlib.Path) -> Iterator[str]:
    """The strings a corpus file contributes."""
    if path.suffix != ".jsonl":
        try:
            yield path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise VocabError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise VocabError(f"{path}: cannot read it as UTF-8 text: {exc}") from None
        return
    if not path.is_file():
        raise VocabError(f"{path}: no such file")
    try:
        records = jsonl_records(path)
    except WorkloadError as exc:
        raise VocabError(str(exc)) from None
    for n, doc in records:
        found = False
        for key in TEXT_FIELDS:
            if isinstance(doc.get(key), str):
                found = True
                yield doc[key]
        for key in TURN_LISTS:
            for turn in doc.get(key) or ():
                for field in TURN_FIELDS:
                    if isinstance(turn, dict) and isinstance(turn.get(field), str):
                        found = True
                        yield turn[field]
        if not found:
            raise VocabError(f"{path}:{n}: no text field ({', '.join(TEXT_FIELDS + TURN_LISTS)})")


def rank(tokenizer: object, corpus: Sequence[pathlib.Path]) -> tuple[list[int], list[int], int]:
    """(ranked ids, their counts, tokens counted): EOS and BOS first, then by count."""
    counts: collections.Counter[int] = collections.Counter()
    for path in corpus:
        for text in texts(path):
            counts.update(tokenizer.encode(text, add_special_tokens=False, verbose=False))  # type: ignore[attr-defined]
    total = sum(counts.values())
    if not total:
        raise VocabError("the corpus holds no tokens")
    special = [i for i in (getattr(tokenizer, "eos_token_id", None),
                           getattr(tokenizer, "bos_token_id", None)) if isinstance(i, int)]
    special = list(dict.fromkeys(special))
    rest = sorted((i for i in counts if i not in special), key=lambda i: (-counts[i], i))
    ids = special + rest
    return ids, [counts.get(i, 0) for i in ids], total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Rank a tokenizer's ids by a corpus's token counts: the active "
        "vocabulary file of --draft-active-vocab-ids / --eagle-draft-active-vocab-ids.")
    parser.add_argument("corpus", nargs="+", type=pathlib.Path, metavar="CORPUS",
                        help="text files, or JSON lines with prompt/text/completion/output/"
                        "response fields or ShareGPT conversations")
    parser.add_argument("--tokenizer", required=True,
                        help="the model's tokenizer (a local model or tokenizer directory)")
    parser.add_argument("--output", required=True, type=pathlib.Path, help="the file to write")
    parser.add_argument("--size", type=positive_int, default=None,
                        help="keep the first N ranked ids (default: every id the corpus holds)")
    args = parser.parse_args(argv)
    try:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise VocabError(f"--tokenizer {args.tokenizer}: cannot load a tokenizer there: "
                             f"{str(exc).splitlines()[0]}") from None
        ids, counts, total = rank(tokenizer, args.corpus)
    except VocabError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.size is not None:
        if args.size > len(ids):
            print(f"{PROG}: error: --size {args.size}: the corpus holds only {len(ids)} distinct "
                  "ids", file=sys.stderr)
            return 2
        ids, counts = ids[:args.size], counts[:args.size]
    covered = sum(counts)
    doc = {"format": FORMAT, "version": VERSION, "tokenizer": str(args.tokenizer),
           "vocab_size": len(tokenizer), "corpus": [str(p) for p in args.corpus],
           "tokens_counted": total, "tokens_covered": covered, "ids": ids, "counts": counts}
    try:
        write_atomic(args.output, json.dumps(doc, separators=(",", ":")) + "\n")
    except OSError as exc:
        print(f"{PROG}: error: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
        return 2
    cumulative = 0
    marks = {}
    for n, c in enumerate(counts, 1):
        cumulative += c
        marks[n] = cumulative
    sizes = sorted({s for s in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768) if s < len(ids)}
                   | {len(ids)})
    cover = ", ".join(f"{s}: {100 * marks[s] / total:.1f}%" for s in sizes)
    print(f"{PROG}: {len(ids)} of {len(tokenizer)} ids written to {args.output} "
          f"({total} corpus tokens); share of the corpus's tokens the first N ids cover: {cover}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
