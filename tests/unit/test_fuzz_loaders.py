"""Property-based tests (hypothesis) of every loader of a user-supplied file or text, and of
the launcher's argv: bad input gets ONE clear error -- a
:class:`~vllm_hust_vspec.errors.VspecError` whose one-line message names the file, key or
flag -- never a traceback.

The strategies (valid-shaped documents with mutated keys, values and types, damaged files,
raw junk bytes) live in :mod:`fuzz_strategies`, shared with ``scripts/fuzz_loaders.py``
(the long run: ``--cases 10000``).  Each loader gets a few hundred derandomised cases here;
the explicit inputs below are the bugs the fuzzing found, kept as regressions.  Nothing
starts an engine or a server: the launcher runs as ``cli.prepare`` (what ``--dry-run``
prints), never its exec.
"""

from __future__ import annotations

import atexit
import shutil

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings

import fuzz_strategies as F

pytestmark = pytest.mark.unit

WORKDIR = F.make_workdir()  # the cases' files; removed at exit (collected-only runs too)
atexit.register(shutil.rmtree, WORKDIR, ignore_errors=True)
hypothesis.configuration.set_hypothesis_home_dir(str(WORKDIR / ".hypothesis"))
LOADERS = F.loaders(WORKDIR)
# cases per loader (the launcher's argv is the slowest: argparse + resolve per case)
EXAMPLES = {name: 250 for name in LOADERS} | {"launcher_argv": 200, "schedule": 300}
OK = ("valid", "error")


def _explain(name: str, out: F.Outcome) -> str:
    return f"{name}: {out.kind}: {out.message}\n{out.detail}"


def _fuzz_test(name: str):
    """``test_fuzz_<name>``: every generated case of the loader is a valid object or one
    named error."""
    loader = LOADERS[name]

    # (a samples file of latencies near 1e308 fits, with an rmse that overflows to inf)
    @pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
    @settings(max_examples=EXAMPLES[name], deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.large_base_example, HealthCheck.filter_too_much])
    @given(case=loader.cases)
    def test(case):
        out = F.classify(loader, case, WORKDIR)
        assert out.kind in OK, _explain(name, out)

    test.__name__ = test.__qualname__ = f"test_fuzz_{name}"
    return test


for _name in LOADERS:
    globals()[f"test_fuzz_{_name}"] = _fuzz_test(_name)


# --------------------------------------------------------------------------- regressions
# The inputs that raised a traceback (or gave a message that was not one line) before the
# loaders were fixed; each must now be one named error.

DEEP = b"[" * 5000
LONG_INT = b"{\"x\": " + b"9" * 5000 + b"}"
NOT_UTF8 = b"\xff\xfe{}"
# JSON loaders: not UTF-8 (UnicodeDecodeError), nesting past the recursion limit
# (RecursionError), an integer literal past the 4300-digit limit (ValueError)
JSON_FILE_LOADERS = ("profile", "profile_samples", "cost_table", "calibration_grid",
                     "native_table", "bench_results", "decision_trace", "sim_trace",
                     "prompt_set", "dataset")


def _file_case(name: str, data: bytes):
    if name == "native_table":
        return F.NativeCase(data)
    if name == "dataset":
        return F.DatasetCase("sharegpt", data, ".json", "ok")
    file = {"sim_trace": "trace.jsonl", "prompt_set": "code.jsonl",
            "decision_trace": "decisions.jsonl"}.get(name, f"{name}.json")
    params = (("draft_width", 4), ("max_model_len", None), ("max_num_seqs", None)) \
        if name == "calibration_grid" else ()
    return F.FileCase(data, file, params)


@pytest.mark.parametrize("data", [NOT_UTF8, DEEP, LONG_INT], ids=["not-utf8", "deep", "long-int"])
@pytest.mark.parametrize("name", JSON_FILE_LOADERS)
def test_parser_failures_are_one_named_error(name, data):
    out = F.classify(LOADERS[name], _file_case(name, data), WORKDIR)
    assert out.kind == "error", _explain(name, out)


@pytest.mark.parametrize("data", [NOT_UTF8, b"a = " + DEEP, b"[serve]\ngamma = " + b"9" * 5000],
                         ids=["not-utf8", "deep", "long-int"])
@pytest.mark.parametrize("name, file", [("launcher_toml", "preset.toml"),
                                        ("model_registry", "registry.toml")])
def test_toml_parser_failures_are_one_named_error(name, file, data):
    out = F.classify(LOADERS[name], F.FileCase(data, file), WORKDIR)
    assert out.kind == "error", _explain(name, out)


def _profile(**changes) -> bytes:
    doc = F.copy.deepcopy(F.PROFILE_BASES[0]) | changes
    return F.json_dumps(doc).encode()


def _table(**changes) -> bytes:
    doc = F.copy.deepcopy(F.TABLE_BASES[0])
    doc["additive"]["alpha_s"] |= changes
    return F.json_dumps(doc).encode()


def _results(run=None, window=None) -> bytes:
    doc = F.copy.deepcopy(F.RESULTS_BASE)
    doc["runs"][0] |= run or {}
    doc["paired"][0] |= window or {}
    return F.json_dumps(doc).encode()


def _trace(request: dict) -> bytes:
    lines = F.copy.deepcopy(F.TRACE_BASES[-1])
    lines[1] |= request
    return F.jsonl_dumps(lines).encode()


def _decisions(extra: dict) -> bytes:
    return F.jsonl_dumps(F.copy.deepcopy(F.DECISION_BASES[0]) + [extra]).encode()


REGRESSIONS = [
    # '²'.isdigit() is True but int('²') raises ValueError
    ("profile", _profile(batch_gamma_policy={"²": 1}), "batch_gamma_policy.²"),
    ("profile", _profile(per_gamma_overhead_ms={"²": 1.0}), "per_gamma_overhead_ms.²"),
    ("profile", _profile(per_gamma_overhead_ms={"9" * 5000: 1.0}), "per_gamma_overhead_ms.999"),
    ("cost_table", _table(**{"²": 0.1}), "additive.alpha_s.²"),
    # a JSON integer past float range: math.isfinite raised OverflowError
    ("bench_results", _results(run={"tpot_ms": 10**400}), "tpot_ms"),
    ("bench_results", _results(window={"ms": 10**400}), "ms"),
    ("sim_trace", _trace({"arrival_s": 10**400}), "arrival_s"),
    ("sim_trace", _trace({"p": [[10**400, 0.5], [0.1, 0.0]]}), "'p'"),
    # batch_gamma_policy K = Infinity: int(inf) raised OverflowError
    ("native_table", _profile(batch_gamma_policy={"1": float("inf")}), "batch_gamma_policy"),
    # a line break in a key: the message spanned two lines
    ("profile", _profile(target={"alpha": 0.0, "gamma": 0.1, "delta_ms": 1.0, "a\nb": 1}), "a\\nb"),
    ("launcher_toml", b'[env]\n"HUST_VSPEC_X\\nY" = "1"\n', "HUST_VSPEC_X\\nY"),
    # ~user of an unknown user: pathlib's expanduser raised RuntimeError
    ("model_registry", b'{"m": "~no-such-user/m"}', None),
    # decision records the summary could not read: KeyError / TypeError / ValueError
    ("decision_trace", _decisions({"step": 9, "k": "2", "policy": "online", "batch": 1}), ": k: "),
    ("decision_trace", _decisions({"step": 9, "k": 1, "policy": "online"}), "batch"),
    ("decision_trace", _decisions({"step": 9, "drafted": None, "accepted": 1}), "drafted"),
    ("decision_trace", _decisions({"window": 3, "tokens": 5, "ms": 1.0}), "policy"),
    ("decision_trace", _decisions({"step": 9, "k": 10**400, "policy": "online", "batch": 1}), ": k: "),
]


@pytest.mark.parametrize("name, data, key", REGRESSIONS,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(REGRESSIONS)])
def test_fuzz_findings_are_one_named_error(name, data, key):
    file = {"launcher_toml": "preset.toml", "model_registry": "registry.json"}.get(name)
    case = F.FileCase(data, file) if file else _file_case(name, data)
    out = F.classify(LOADERS[name], case, WORKDIR)
    if key is None:  # loads: the object is valid
        assert out.kind == "valid", _explain(name, out)
        return
    assert out.kind == "error", _explain(name, out)
    assert key in out.message, out.message


@pytest.mark.parametrize("table", [0.0, 3, None, True, object()])
def test_a_schedule_that_is_neither_text_nor_rows_is_one_error(table):
    """``parse_schedule`` iterated any non-string: ``TypeError: 'float' object is not
    iterable``."""
    out = F.classify(LOADERS["schedule"], F.ScheduleCase(table, 4), WORKDIR)
    assert out.kind == "error" and F.SCHEDULE_SOURCE in out.message, out


ARGV_REGRESSIONS = [
    # '²'.isdigit() passed check_compare, then check_kmax's int('²') raised ValueError
    (["--target-model", "/m", "--draft-model", "/d", "--adaptive-compare", "fixed:²,online",
      "--adaptive-trace-file", "/tmp/t.jsonl"], "adaptive_compare"),
    # a line break in an argument: argparse's message spanned two lines
    (["--target-model", "/m", "a\nb"], "a\\nb"),
    # a model path of an unknown user's ~name: pathlib's expanduser raised RuntimeError
    (["--target-model", "~no-such-user/m", "--draft-model", "/d"], None),
    # a blank or multi-line path named only an invisible file (cost table ' ': field ...)
    (["--target-model", "/m", "--draft-model", "/d", "--adaptive-policy", "budget",
      "--adaptive-dspark-cost-table", " "], "--adaptive-dspark-cost-table"),
    (["--target-model", "/m", "--draft-model", "/d", "--config", "a\nb.toml"], "--config"),
]
# a NUL byte in a TOML path value: open() raised a bare ValueError (grid, registry)
NUL_PRESETS = [b'[serve]\nadaptive_policy = "budget"\nadaptive_dspark_calibration = "a\\u0000b"\n',
               b'[serve]\nmodel_registry = "a\\u0000b"\ntarget_model = "t"\n',
               b'[serve]\nadaptive_policy = "budget"\nadaptive_dspark_cost_table = "a\\u0000b"\n']


@pytest.mark.parametrize("argv, key", ARGV_REGRESSIONS,
                         ids=["compare-superscript", "newline-arg", "unknown-user-home",
                              "blank-path", "newline-path"])
def test_launcher_argv_findings_are_one_named_error(argv, key):
    out = F.classify(LOADERS["launcher_argv"], F.ArgvCase(tuple(argv), (), ()), WORKDIR)
    if key is None:  # resolves: the plan is built
        assert out.kind == "valid", _explain("launcher_argv", out)
        return
    assert out.kind == "error", _explain("launcher_argv", out)
    assert key in out.message, out.message


@pytest.mark.parametrize("preset", NUL_PRESETS, ids=["grid", "registry", "cost-table"])
def test_a_nul_byte_in_a_preset_path_is_one_named_error(preset):
    config = str(WORKDIR / "config.toml")
    case = F.ArgvCase(("--config", config, "--draft-model", "/d"), (("config.toml", preset),), ())
    out = F.classify(LOADERS["launcher_argv"], case, WORKDIR)
    assert out.kind == "error", _explain("launcher_argv", out)
    assert "[serve]" in out.message and "NUL" in out.message, out.message
