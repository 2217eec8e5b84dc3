"""One source for each name, default, error and field check: :mod:`vllm_hust_vspec.names`,
:mod:`vllm_hust_vspec.errors`, :mod:`vllm_hust_vspec.checks`, the schedule parser and the
controller config's defaults."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pathlib
import subprocess
import sys

import pytest

from vllm_hust_vspec import checks, names, settings
from vllm_hust_vspec.adaptive.controller import ControllerConfig
from vllm_hust_vspec.adaptive.policies.registry import policy_names
from vllm_hust_vspec.adaptive.policies.schedule import SchedulePolicy
from vllm_hust_vspec.adaptive.policies.stop import StopRule
from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.runtime.controller_factory import controller_config

pytestmark = pytest.mark.unit

SRC = pathlib.Path(settings.__file__).parent


def _own_imports(module_file: pathlib.Path) -> set[str]:
    """The vllm_hust_vspec modules a file imports (absolute and relative)."""
    tree = ast.parse(module_file.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                out.add("." * node.level + (node.module or ""))
            elif node.module and node.module.startswith("vllm_hust_vspec"):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("vllm_hust_vspec"))
    return out


# ----------------------------------------------------------------------------- layering


def test_names_and_errors_are_leaves():
    assert _own_imports(SRC / "names.py") == set()
    assert _own_imports(SRC / "errors.py") == set()
    assert _own_imports(SRC / "checks.py") <= {"vllm_hust_vspec.errors"}


def test_settings_imports_only_leaves():
    assert _own_imports(SRC / "settings.py") <= {
        "vllm_hust_vspec.names", "vllm_hust_vspec.errors", "vllm_hust_vspec.checks",
        "vllm_hust_vspec.retired", "vllm_hust_vspec.vocab_ids"}


# ----------------------------------------------------------------------------- names


def test_policy_names_have_one_source():
    assert settings.option("adaptive_policy").choices == names.POLICIES
    assert set(names.POLICIES) <= set(policy_names())
    assert set(names.STANDARD_POLICIES) <= set(names.POLICIES)


def test_stop_modes_and_entropy_have_one_source():
    assert settings.option("adaptive_stop").choices == names.STOP_MODES
    for mode in names.STOP_MODES:
        StopRule(mode, 0.1)
    assert settings.option("adaptive_stop_entropy").maximum == names.MAX_ENTROPY
    with pytest.raises(ValueError, match="unknown"):
        StopRule("nope", 0.1)


@pytest.mark.parametrize("module, attr", [
    ("vllm_hust_vspec.adaptive.observations", "ENTROPY_TOPK"),
    ("vllm_hust_vspec.adaptive.policies.registry", "STANDARD_POLICIES"),
])
def test_old_definitions_are_gone(module, attr):
    assert not hasattr(importlib.import_module(module), attr)


# ----------------------------------------------------------------------------- errors


def test_vspec_error_line():
    err = VspecError("cfg.toml", "gamma", "must be >= 1")
    assert str(err) == "cfg.toml: gamma: must be >= 1"
    assert (err.source, err.field, err.message) == ("cfg.toml", "gamma", "must be >= 1")
    assert str(VspecError(None, "gamma", "bad")) == "gamma: bad"
    assert str(VspecError("--flag", None, "bad")) == "--flag: bad"
    whole = VspecError("one finished line")
    assert str(whole) == "one finished line" and whole.source is None and whole.field is None
    with pytest.raises(TypeError):
        VspecError("a", "b")


ERROR_CLASSES = [
    ("vllm_hust_vspec.settings", "SettingsError", ValueError),
    ("vllm_hust_vspec.launcher.errors", "LaunchError", ValueError),
    ("vllm_hust_vspec.startup_cost.grid", "CalibrationError", ValueError),
    ("vllm_hust_vspec.adaptive.costmodel", "CostTableError", ValueError),
    ("vllm_hust_vspec.adaptive.profile", "ProfileError", ValueError),
    ("vllm_hust_vspec.adaptive.simulate", "TraceError", ValueError),
    ("vllm_hust_vspec.patches.registry", "PatchError", RuntimeError),
    ("vllm_hust_vspec.patches.registry", "SymbolMissing", LookupError),
    ("vllm_hust_vspec.tools.bench", "BenchError", Exception),
    ("vllm_hust_vspec.tools.bench_ab", "AbError", Exception),
    ("vllm_hust_vspec.tools.bench_configs", "ConfigError", ValueError),
    ("vllm_hust_vspec.tools.bench_driver", "DriveError", RuntimeError),
    ("vllm_hust_vspec.tools.bench_results", "ResultsError", ValueError),
    ("vllm_hust_vspec.tools.bench_server", "ServerError", RuntimeError),
    ("vllm_hust_vspec.tools.bench_workloads", "WorkloadError", ValueError),
    ("vllm_hust_vspec.tools.doctor", "UsageError", Exception),
    ("vllm_hust_vspec.tools.manifest_check", "ManifestError", Exception),
    ("vllm_hust_vspec.tools.profile", "ProfileToolError", Exception),
]


@pytest.mark.parametrize("module, name, extra", ERROR_CLASSES)
def test_every_error_derives_from_the_base(module, name, extra):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, VspecError) and issubclass(cls, extra)


def test_loader_errors_take_source_field_message():
    from vllm_hust_vspec.adaptive.costmodel import CostTableError
    from vllm_hust_vspec.adaptive.profile import ProfileError
    from vllm_hust_vspec.adaptive.simulate import TraceError
    from vllm_hust_vspec.startup_cost.grid import CalibrationError

    assert str(CalibrationError("a.json", "contexts[0]", "bad")) == "a.json: contexts[0]: bad"
    cost = CostTableError("t.json", "dtype", "differs")
    assert str(cost) == "cost table t.json: field 'dtype': differs" and cost.field == "dtype"
    assert str(CostTableError(None, "dtype", "x")) == "cost table: field 'dtype': x"
    assert str(ProfileError("profile p.json", "fit", "must be an object")) == (
        "profile p.json: key 'fit' must be an object")
    assert str(TraceError("t.jsonl:2", "id", "must be a string")) == "t.jsonl:2: key 'id' must be a string"
    with pytest.raises(CalibrationError, match="a.json: x: must be an integer"):
        checks.integer("1", "a.json", "x", error=CalibrationError)


def test_errors_pickle():
    import pickle

    from vllm_hust_vspec.adaptive.costmodel import CostTableError

    for err in (VspecError("s", "f", "m"), CostTableError("t.json", "dtype", "m"),
                settings.SettingsError("whole")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)


# ----------------------------------------------------------------------------- checks


def test_checks_predicates():
    assert checks.is_int(3) and not checks.is_int(True) and not checks.is_int(3.0)
    assert checks.is_number(2.5) and checks.is_number(2)
    assert not checks.is_number(float("nan")) and not checks.is_number(False)
    assert not checks.is_number("1")


def test_checks_integer_and_number():
    assert checks.integer(3, "s", "f", minimum=1, maximum=4) == 3
    with pytest.raises(VspecError, match="s: f: must be an integer, got True"):
        checks.integer(True, "s", "f")
    with pytest.raises(VspecError, match="must be >= 1, got 0 \\(why\\)"):
        checks.integer(0, "s", "f", minimum=1, hint=" (why)")
    with pytest.raises(VspecError, match="must be <= 4, got 5"):
        checks.integer(5, "s", "f", maximum=4)
    assert checks.number(2, "s", "f", minimum=0) == 2.0
    with pytest.raises(VspecError, match="must be a finite number"):
        checks.number(float("inf"), "s", "f")
    with pytest.raises(VspecError, match="must be > 0"):
        checks.number(0, "s", "f", above=0)
    with pytest.raises(VspecError, match="must be >= 0"):
        checks.number(-1, "s", "f", minimum=0)


def test_checks_int_list():
    assert checks.int_list([1, 2, 4], "s", "b") == [1, 2, 4]
    assert checks.int_list([], "s", "b", nonempty=False) == []
    with pytest.raises(VspecError, match="s: b: must be a non-empty list"):
        checks.int_list([], "s", "b")
    with pytest.raises(VspecError, match=r"s: b\[1\]: must be an integer"):
        checks.int_list([1, "2"], "s", "b")
    with pytest.raises(VspecError, match=r"s: b\[1\]: 1 after 2: the list must be strictly increasing"):
        checks.int_list([2, 1], "s", "b")
    assert checks.int_list([2, 1], "s", "b", increasing=False) == [2, 1]


def test_checks_mappings_and_keys():
    assert checks.mapping({"a": 1}, "s", "m") == {"a": 1}
    with pytest.raises(VspecError, match="s: m: must be an object"):
        checks.mapping([1], "s", "m")
    with pytest.raises(VspecError, match="must be a non-empty object"):
        checks.mapping({}, "s", "m", nonempty=True, what="a non-empty object")
    checks.known_keys({"a": 1}, ("a", "b"), "s")
    with pytest.raises(VspecError, match=r"s: x\.c: unknown key \(known: a, b\)"):
        checks.known_keys({"a": 1, "c": 2}, ("a", "b"), "s", prefix="x.")
    with pytest.raises(VspecError, match="s: b: missing"):
        checks.required_keys({"a": 1}, ("a", "b"), "s")
    assert checks.one_of("x", ("x", "y"), "s", "f") == "x"
    with pytest.raises(VspecError, match="must be one of x, y, got 'z'"):
        checks.one_of("z", ("x", "y"), "s", "f")


# ----------------------------------------------------------------------------- defaults


def test_controller_config_defaults_are_the_option_schema_defaults():
    plain = ControllerConfig(kmax=4)
    mapped = {f.name: f.metadata["option"] for f in dataclasses.fields(ControllerConfig)
              if "option" in f.metadata}
    assert ControllerConfig.SETTINGS_MAP == {opt: fld for fld, opt in mapped.items()}
    assert len(mapped) == len(ControllerConfig.SETTINGS_MAP) >= 16
    for fld, opt in mapped.items():
        assert settings.option(opt).group == "controller", opt
        assert getattr(plain, fld) == settings.option(opt).default, fld


def test_controller_config_follows_a_changed_schema_default():
    """The defaults are read from OPTIONS: a changed option default changes the config
    (in a fresh interpreter, so this process keeps its classes)."""
    code = (
        "import dataclasses\n"
        "from vllm_hust_vspec import settings\n"
        "o = settings.option('adaptive_online_window')\n"
        "settings._BY_NAME[o.name] = dataclasses.replace(o, default=512)\n"
        "from vllm_hust_vspec.adaptive.controller import ControllerConfig\n"
        "print(ControllerConfig(kmax=4).window)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "512"


def test_controller_config_ranges_are_the_option_ranges():
    with pytest.raises(ValueError, match="window=4 must be >= 8"):
        ControllerConfig(kmax=4, window=4).validate()
    with pytest.raises(ValueError, match=r"hysteresis=2 must be in \[0, 1\]"):
        ControllerConfig(kmax=4, hysteresis=2).validate()
    with pytest.raises(ValueError, match="stop_entropy"):
        ControllerConfig(kmax=4, stop_entropy=names.MAX_ENTROPY + 0.1).validate()
    with pytest.raises(ValueError, match="stop='x' must be one of"):
        ControllerConfig(kmax=4, stop="x").validate()


# ----------------------------------------------------------------------------- schedule


def test_one_schedule_parser_for_text_and_host_table():
    text = "5-32:2,1-4:4"
    table = [(5, 32, 2), (1, 4, 4)]
    assert settings.parse_schedule(text, "s") == settings.parse_schedule(table, "s") == [
        (1, 4, 4), (5, 32, 2)]
    a, b = SchedulePolicy(text, kmax=4), SchedulePolicy(table, kmax=4)
    assert a.table == b.table
    assert [a.lookup(n) for n in range(1, 40)] == [b.lookup(n) for n in range(1, 40)]
    # the launcher's text and the host's table give the same controller
    via_text = controller_config(settings.Settings({"adaptive_policy": "schedule",
                                                   "adaptive_schedule": text}), 4)
    via_host = controller_config(settings.Settings({"adaptive_policy": "schedule"}), 4,
                                 host_table=table)
    assert via_host.schedule == ((1, 4, 4), (5, 32, 2))
    pa, pb = SchedulePolicy(via_text.schedule, 4), SchedulePolicy(via_host.schedule, 4)
    assert [pa.lookup(n) for n in range(1, 40)] == [pb.lookup(n) for n in range(1, 40)]


@pytest.mark.parametrize("table, match", [
    ("2-4:2", "must start at batch size 1"),
    ([(2, 4, 2)], "must start at batch size 1"),
    ("1-4:2,3-8:1", "overlaps"),
    ([(1, 4, 2), (3, 8, 1)], "overlaps"),
    ("1-4:9", r"K=9 for batch sizes 1-4 is out of range \[0, 4\]"),
    ([(1, 4, 9)], r"K=9 for batch sizes 1-4 is out of range \[0, 4\]"),
    ("1-x:2", "bad entry '1-x:2'"),
    ([(1, 4)], r"bad entry \(1, 4\)"),
    ([], "empty table"),
])
def test_schedule_refusals_are_the_same_for_both_forms(table, match):
    with pytest.raises(settings.SettingsError, match="^src: .*" + match):
        settings.parse_schedule(table, "src", kmax=4)


def test_host_table_k_above_kmax_is_refused_naming_the_host_option():
    with pytest.raises(settings.SettingsError, match="num_speculative_tokens_per_batch_size: K=9"):
        controller_config(settings.Settings({"adaptive_policy": "schedule"}), 4,
                          host_table=[(1, 4, 9)])
