"""Bad input: one clear error naming the file/key/flag, a non-zero exit, before any model
loads (the launcher never imports vLLM on these paths, so each case returns in well under
the seconds a model load takes)."""

from __future__ import annotations

import time

import pytest
from launcher_util import REPO, clean_env, launcher

pytestmark = pytest.mark.cli

BASE = ("--target-platform", "cpu", "--target-model", "/m/t", "--draft-model", "/m/d")


def fails(*args: str, env=None, expect: tuple[str, ...] = ()) -> str:
    t0 = time.monotonic()
    proc = launcher(*args, env=env)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    err = proc.stderr
    assert err.count("error:") == 1, err
    assert "Traceback" not in err
    assert "INFO" not in err and "vllm.entrypoints" not in err  # nothing started
    assert elapsed < 10
    for e in expect:
        assert e in err, err
    return err


def write(tmp_path, text: str):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    return str(p)


def test_malformed_toml(tmp_path):
    path = write(tmp_path, '[serve]\ngamma = \n')
    fails("--config", path, *BASE, "--dry-run", expect=(path, "malformed TOML"))


def test_unknown_key(tmp_path):
    path = write(tmp_path, '[serve]\ngama = 4\n')
    fails("--config", path, *BASE, "--dry-run", expect=(path, "[serve]", "'gama'"))


def test_unknown_table(tmp_path):
    path = write(tmp_path, '[server]\ngamma = 4\n')
    fails("--config", path, *BASE, "--dry-run", expect=(path, "'server'"))


def test_wrong_type(tmp_path):
    path = write(tmp_path, '[serve]\ngamma = "four"\n')
    fails("--config", path, *BASE, "--dry-run",
          expect=(path, "[serve] gamma", "expected integer", "'four'"))
    path = write(tmp_path, '[serve]\nprefix_caching = "yes please"\n')
    fails("--config", path, *BASE, "--dry-run", expect=("prefix_caching", "expected boolean"))


def test_wrong_type_on_the_command_line():
    fails(*BASE, "--max-num-seqs", "many", "--dry-run",
          expect=("--max-num-seqs", "expected integer"))
    fails(*BASE, "--graph-mode", "warp", "--dry-run", expect=("--graph-mode", "'warp'"))


def test_out_of_range(tmp_path):
    path = write(tmp_path, '[serve]\nadaptive_hysteresis = 1.5\n')
    fails("--config", path, *BASE, "--dry-run",
          expect=(path, "adaptive_hysteresis", "out of range [0, 1]"))
    fails(*BASE, "--port", "70000", "--dry-run", expect=("--port", "out of range"))
    fails(*BASE, "--gamma", "0", "--dry-run", expect=("--gamma", "out of range"))
    fails(*BASE, "--gamma", "2", "--adaptive-min-gamma", "3", "--dry-run",
          expect=("adaptive_min_gamma=3", "Kmax"))


def test_env_table_may_not_set_plugin_vars(tmp_path):
    path = write(tmp_path, '[env]\nHUST_VSPEC_ADAPTIVE_POLICY = "fixed"\n')
    fails("--config", path, *BASE, "--dry-run",
          expect=(path, "[env] HUST_VSPEC_ADAPTIVE_POLICY", "HUST_VSPEC_*"))
    path = write(tmp_path, '[env]\nHUST_SPECSLO_ADAPTIVE_POLICY = "fixed"\n')
    fails("--config", path, *BASE, "--dry-run", expect=("HUST_SPECSLO_ADAPTIVE_POLICY",))


def test_missing_config_file(tmp_path):
    fails("--config", str(tmp_path / "nope.toml"), *BASE, "--dry-run",
          expect=("nope.toml", "not found"))


def test_unknown_protocol():
    fails(*BASE, "--protocol", "arc-hard", "--dry-run",
          expect=("--protocol", "'arc-hard'", "arc-easy", "qwen35-frontier-mtp2"))


def test_unknown_protocol_in_toml(tmp_path):
    path = write(tmp_path, '[serve]\nprotocol = "nope"\n')
    fails("--config", path, *BASE, "--dry-run", expect=(path, "protocol", "'nope'"))


@pytest.mark.parametrize("args, expect", [
    (["--protocol", "arc-easy", "--max-num-seqs", "32"],
     ("protocol arc-easy pins max_num_seqs = 16", "got 32 from --max-num-seqs")),
    (["--protocol", "arc-easy", "--prefix-caching"],
     ("pins prefix_caching = false", "--prefix-caching")),
    (["--protocol", "arc-easy", "--method", "eagle3"],
     ("protocol arc-easy was validated with method draft_model or eagle", "'eagle3'")),
    (["--protocol", "qwen35-frontier-mtp2", "--gamma", "4"], ("pins gamma = 6",)),
    (["--protocol", "qwen35-frontier-mtp2", "--tensor-parallel-size", "4"],
     ("pins tensor_parallel_size = 2",)),
    (["--protocol", "qwen35-frontier-mtp2", "--graph-mode", "full"],
     ("pins graph_mode = 'full-and-piecewise'",)),
    (["--protocol", "qwen35-frontier-mtp2", "--no-async-scheduling"],
     ("pins async_scheduling = true",)),
])
def test_protocol_deviation(args, expect):
    fails("--target-platform", "cpu", "--target-model", "/m/t", *args, "--dry-run",
          expect=expect)


def test_protocol_deviation_from_toml(tmp_path):
    path = write(tmp_path, '[serve]\nprotocol = "arc-easy"\nmax_model_len = 4096\n')
    fails("--config", path, "--target-platform", "cpu", "--dry-run",
          expect=("pins max_model_len = 32768", f"{path}: [serve] max_model_len"))


def test_missing_model_path_on_a_real_start(tmp_path):
    err = fails("--target-platform", "cpu", "--target-model", str(tmp_path / "no-target"),
                "--draft-model", "small-draft", "--model-dir", str(tmp_path),
                expect=("method draft_model needs a target model and a draft model",
                        "no-target", "--target-model PATH", "small-draft",
                        str(tmp_path / "small-draft"), "--draft-model PATH"))
    assert "from --target-model" in err


def test_bare_name_without_a_model_dir():
    env = clean_env()
    del env["HUST_VSPEC_MODEL_DIR"]
    fails("--target-platform", "cpu", "--method", "ngram", "--target-model", "tiny", env=env,
          expect=("'tiny'", "HUST_VSPEC_MODEL_DIR", "--target-model PATH"))


def test_no_target_model_at_all():
    fails("--target-platform", "cpu", "--dry-run", "--method", "ngram",
          expect=("needs a target model", "--target-model", "HUST_VSPEC_TARGET_MODEL"))


def test_draft_method_needs_a_draft_model():
    fails("--target-platform", "cpu", "--target-model", "/m/t", "--dry-run",
          expect=("method draft_model needs a draft model", "--draft-model"))


@pytest.mark.parametrize("method", ["mtp", "qwen3_5_mtp"])
def test_draft_model_given_to_mtp(method):
    fails(*BASE, "--method", method, "--dry-run",
          expect=("method mtp takes no draft model", "--draft-model"))


def test_draft_model_given_to_mtp_in_toml(tmp_path):
    path = write(tmp_path, '[serve]\nmethod = "mtp"\ndraft_model = "draft"\n')
    fails("--config", path, "--target-platform", "cpu", "--target-model", "/m/t", "--dry-run",
          expect=("method mtp takes no draft model", f"{path}: [serve] draft_model"))


@pytest.mark.parametrize("args, expect", [
    (["--json"], ("--json", "--dry-run")),
    (["--method", "none", "--gamma", "3", "--dry-run"], ("method none", "--gamma")),
    (["--method", "none", "--adaptive-policy", "fixed", "--dry-run"],
     ("method none", "--adaptive-policy")),
    (["--no-adaptive-speculation", "--adaptive-policy", "fixed", "--dry-run"],
     ("--no-adaptive-speculation", "--adaptive-policy")),
    (["--adaptive-profile", "p.json", "--adaptive-policy", "online", "--dry-run"],
     ("--adaptive-profile", "--adaptive-policy", "profile policy")),
    (["--graph-mode", "eager", "--capture-policy", "exact", "--dry-run"],
     ("--graph-mode eager", "--capture-policy")),
    (["--device", "0", "--dry-run"], ("--device", "platform cpu")),
    (["--prompt-lookup-max", "3", "--dry-run"], ("--prompt-lookup-max", "ngram")),
    (["--dry-run", "--", "--speculative-config", "{}"],
     ("'--speculative-config'", "launcher's own")),
    (["--port", "8000", "--dry-run", "--", "--port=9000"], ("'--port=9000'", "--port")),
    (["--no-prefix-caching", "--dry-run", "--", "--enable-prefix-caching"],
     ("'--enable-prefix-caching'",)),
    (["--graph-mode", "full", "--dry-run", "--", "-cc", "{}"], ("'-cc'",)),
    (["--dry-run", "--", "--model", "/other"], ("'--model'",)),
])
def test_conflicting_flags(args, expect):
    base = BASE if "--method" not in args else ("--target-platform", "cpu", "--target-model",
                                                "/m/t")
    fails(*base, *args, expect=("conflicting options" if "none" not in args else "method none",
                                *expect))


@pytest.mark.parametrize("flag", [
    "--gama",  # typo
    "--adaptive-entropy-stop",  # vSpec top-2 entropy stop: ours is --adaptive-stop entropy (top-8)
])
def test_unknown_flag(flag):
    fails(*BASE, flag, "1", "--dry-run", expect=("unrecognized arguments", flag))


def test_a_negative_refill_batch_is_one_error_naming_the_flag():
    fails(*BASE, "--adaptive-refill-batch", "-1", "--dry-run",
          expect=("--adaptive-refill-batch", "out of range [0, inf]"))
    fails(*BASE, "--adaptive-refill-max-wait-steps", "0", "--dry-run",
          expect=("--adaptive-refill-max-wait-steps",))


def test_vspec_k0_mode_is_refused_with_the_reason():
    """K = 0 here is neither vSpec's sticky (cohort latch) nor its sync (a drafter step)."""
    for args in (["--adaptive-gamma0-mode", "sync"], ["--adaptive-gamma0-mode=sticky"]):
        fails(*BASE, *args, "--dry-run",
              expect=("--adaptive-gamma0-mode", "no drafter forward", "--adaptive-k0-drafter run"))


@pytest.mark.parametrize(("flag", "says"), [
    ("--merged-full", "--graph-mode"),
    ("--no-merged-full", "--graph-mode"),
    ("--merged-full-max-batch", "--capture-sizes"),
    ("--no-shared-tokenizer-padding", "target's tokenizer"),
    ("--mtp-strict-graph", "verify width"),
    ("--eagle-uniform-state-kernel", "EAGLE"),
    ("--graph-event-ordering", "graph replays"),
    ("--adaptive-async", "--no-async-scheduling"),
    ("--eagle-tree-width", "tree drafting"),
    ("--eagle-draft-io-trace-dir", "--adaptive-trace-file"),
    ("--vllm-source", "PYTHONPATH"),
])
def test_vspec_host_flags_are_refused_with_what_to_use(flag, says):
    """vSpec 0.14's flags for its own Ascend graph and kernel paths (issue 19 item 6): one
    error naming the flag, saying it is vSpec's and what to use here."""
    value = [] if flag.startswith("--no-") or flag in ("--merged-full", "--mtp-strict-graph",
                                                       "--eagle-uniform-state-kernel",
                                                       "--graph-event-ordering",
                                                       "--adaptive-async") else ["1"]
    fails(*BASE, flag, *value, "--dry-run",
          expect=(f"error: {flag}: a vSpec 0.14 option this release does not keep", says))


def test_vspec_host_keys_and_variables_are_refused_too(tmp_path):
    config = tmp_path / "old.toml"
    config.write_text('[serve]\ntarget_model = "/m/t"\nmerged_full = false\n')
    fails("--config", str(config), "--target-platform", "cpu", "--dry-run",
          expect=(f"{config}: [serve] merged_full: a vSpec 0.14 option", "--graph-mode"))
    fails(*BASE, "--dry-run", env=clean_env(HUST_VSPEC_USE_MERGED_FULL="0"),
          expect=("environment variable HUST_VSPEC_USE_MERGED_FULL (vSpec's --merged-full)",))


def test_the_plugin_refuses_a_vspec_host_variable_before_anything_starts():
    from vllm_hust_vspec import settings
    with pytest.raises(settings.SettingsError, match="HUST_VSPEC_MTP_STRICT_GRAPH"):
        settings.from_env({"HUST_VSPEC_ENABLED": "1", "HUST_VSPEC_MTP_STRICT_GRAPH": "1"})


def test_active_vocabulary_options_are_checked_before_a_model_loads(tmp_path):
    ids = tmp_path / "ids.json"
    ids.write_text('{"format": "vllm-hust-vspec-active-vocab", "version": 1, "ids": [2, 7]}')
    fails(*BASE, "--draft-active-vocab-size", "8", "--dry-run",
          expect=("--draft-active-vocab-size", "needs draft_active_vocab_ids"))
    fails(*BASE, "--draft-active-vocab-ids", str(ids), "--draft-active-vocab-size", "3",
          "--dry-run", expect=(str(ids), "holds 2 ids, fewer than the 3 asked for"))
    fails(*BASE, "--draft-active-vocab-ids", str(tmp_path / "none.json"), "--dry-run",
          expect=("--draft-active-vocab-ids", "no such file"))
    fails(*BASE, "--eagle-draft-active-vocab-ids", str(ids), "--dry-run",
          expect=("--eagle-draft-active-vocab-ids", "method draft_model"))


def test_lm_head_quantization_takes_what_is_built_and_fits_the_method():
    fails(*BASE, "--draft-lm-head-quantization", "w8a8", "--dry-run",
          expect=("--draft-lm-head-quantization", "expected one of none, w8a16", "'w8a8'"))
    fails(*BASE, "--eagle-draft-lm-head-quantization", "w8a16", "--dry-run",
          expect=("--eagle-draft-lm-head-quantization", "method draft_model"))


def test_lossy_acceptance_is_refused_where_results_are_compared_and_fits_the_method():
    fails(*BASE, "--eagle-relaxed-accept-topk", "2", "--dry-run",
          expect=("--eagle-relaxed-accept-topk", "method draft_model", "EAGLE"))
    fails("--protocol", "arc-easy", "--method", "eagle", "--confidence-accept-margin", "1",
          "--target-platform", "cpu", "--dry-run",
          expect=("--protocol arc-easy compares results", "lossy acceptance (margin1)"))
    fails(*BASE, "--confidence-accept-after-tokens", "4", "--dry-run",
          expect=("--confidence-accept-after-tokens", "tunes confidence_accept_margin",
                  "not set"))


def test_abbreviated_flag_is_unknown():
    fails(*BASE, "--gam", "3", "--dry-run", expect=("unrecognized arguments",))


def test_launcher_never_imports_vllm_for_a_dry_run():
    import subprocess
    import sys
    code = ("import sys; from vllm_hust_vspec.launcher.cli import main; "
            "main(['--target-platform','cpu','--target-model','/m/t','--draft-model','/m/d',"
            "'--dry-run']); assert 'vllm' not in sys.modules and 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
