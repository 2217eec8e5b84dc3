"""The user's own traffic for ``bench ab --dataset``: vLLM's dataset formats, read by vLLM.

``--dataset SPEC`` names one dataset; its prompts become the ``dataset`` workload:

* ``custom:PATH``   vLLM's custom JSON-lines format, one ``{"prompt": str, "output_tokens": int}``
                    per line (``output_tokens`` optional: where a line lacks it, every request
                    asks ``--output-len``, which caps the others);
* ``sharegpt:PATH`` the ShareGPT JSON format (a list of ``{"conversations": [{"value": ...},
                    {"value": ...}, ...]}``; the first turn is the prompt, the second sets the
                    output length);
* ``random:IN,OUT`` vLLM's synthetic ``random`` dataset: prompts of IN tokens, OUT output
                    tokens each (from the target's tokenizer).

The prompts are sampled once, before any server starts, by vLLM's own dataset classes
(``vllm.benchmarks.datasets``) with the target's tokenizer and ``--seed``: every
configuration gets the same requests.  A file that cannot be read or holds no usable prompt
is one :class:`~.bench_workloads.WorkloadError` naming it.
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib

from vllm_hust_vspec import checks

from .bench_workloads import Prompt, WorkloadError, jsonl_records

KINDS = ("custom", "sharegpt", "random")
SOURCE = "dataset"  # the prompt-set name of the dataset workload


def parse_spec(spec: str) -> tuple[str, str]:
    """``"sharegpt:/data/sg.json"`` -> ``("sharegpt", "/data/sg.json")``."""
    kind, sep, arg = spec.partition(":")
    if not sep or kind not in KINDS or not arg:
        raise WorkloadError(f"--dataset {spec!r}: expected custom:PATH, sharegpt:PATH or "
                            "random:INPUT_LEN,OUTPUT_LEN")
    return kind, arg


def _check_file(kind: str, path: pathlib.Path, spec: str) -> bool:
    """What vLLM's loaders would only fail on later, with the file and line named; True
    when every record sets its own output length."""
    if not path.is_file():
        raise WorkloadError(f"--dataset {spec}: {path} not found")
    if kind == "custom":
        if path.suffix != ".jsonl":
            raise WorkloadError(f"--dataset {spec}: vLLM reads the custom format from a .jsonl file")
        own = True
        for i, rec in jsonl_records(path):
            if not isinstance(rec.get("prompt"), str):
                raise WorkloadError(f"{path}:{i}: expected an object with a string 'prompt'")
            n = rec.get("output_tokens")
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise WorkloadError(f"{path}:{i}: 'output_tokens' must be an integer >= 1, got {n!r}")
            own = own and n is not None
        return own
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: {checks.not_utf8(exc)}") from None
    except checks.PARSER_LIMITS as exc:
        raise WorkloadError(f"{path}: invalid JSON: {checks.parser_limit(exc)}") from None
    if not isinstance(doc, list) or not any(
            isinstance(e, dict) and isinstance(e.get("conversations"), list)
            and len(e["conversations"]) >= 2 for e in doc):
        raise WorkloadError(f"{path}: not ShareGPT: expected a list of entries with at least "
                            "two 'conversations' turns")
    return True


def load(spec: str, tokenizer_path: str, num_requests: int, output_len: int,
         seed: int) -> list[Prompt]:
    """``num_requests`` prompts of the dataset ``spec``, sampled by vLLM with the target's
    tokenizer; output lengths capped at ``output_len``."""
    from vllm.benchmarks.datasets.datasets import CustomDataset, RandomDataset, ShareGPTDataset
    from vllm.tokenizers import get_tokenizer

    kind, arg = parse_spec(spec)
    tokenizer = get_tokenizer(tokenizer_path)
    quiet = contextlib.redirect_stdout(io.StringIO())
    if kind == "random":
        try:
            input_len, out_len = (int(x) for x in arg.split(","))
        except ValueError:
            raise WorkloadError(f"--dataset {spec}: expected random:INPUT_LEN,OUTPUT_LEN") from None
        if input_len < 1 or out_len < 1:
            raise WorkloadError(f"--dataset {spec}: lengths must be >= 1")
        with quiet:
            samples = RandomDataset(random_seed=seed).sample(
                tokenizer=tokenizer, num_requests=num_requests, input_len=input_len,
                output_len=out_len, range_ratio=0.0, prefix_len=0)
    else:
        path = pathlib.Path(arg)
        own = _check_file(kind, path, spec)
        cls = CustomDataset if kind == "custom" else ShareGPTDataset
        try:
            with quiet:
                dataset = cls(dataset_path=str(path), random_seed=seed)
                # each record's own output length where it has one; --output-len caps it
                samples = dataset.sample(tokenizer=tokenizer, num_requests=num_requests,
                                         output_len=None if own else output_len,
                                         skip_chat_template=True)
        except (ValueError, KeyError, TypeError) as exc:
            raise WorkloadError(f"--dataset {spec}: vLLM could not read it: {exc}") from None
    prompts = [Prompt(str(s.prompt), max(1, min(int(s.expected_output_len), output_len)), SOURCE)
               for s in samples if isinstance(s.prompt, str) and s.prompt]
    if not prompts:
        raise WorkloadError(f"--dataset {spec}: no usable prompt")
    return prompts
