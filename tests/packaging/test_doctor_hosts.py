"""The doctor on the real vLLM-HUST 0.17.2.post1 and vLLM-Ascend 0.23.0.post1 source trees.

Both exist on PyPI only as sdists; :mod:`sdists` fetches them from the index's simple page,
checks their sha256 and caches them under ``~/.cache/vllm-hust-vspec/sdists/``.  A test skips
(with the reason) only when the index cannot be reached.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import sdists

pytestmark = pytest.mark.packaging

DOCTOR = str(pathlib.Path(sys.executable).parent / "vllm-hust-vspec-doctor")
PER_STEP_K_017 = [
    "vllm.v1.core.sched.output.SchedulerOutput.num_spec_tokens_to_schedule",
    "vllm.v1.core.sched.scheduler.Scheduler.dynamic_sd_lookup",
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner.prev_num_spec_tokens",
]
BASE_PROPOSE_K = "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer.propose"
ASCEND_PROPOSE = "vllm_ascend.spec_decode.llm_base_proposer.AscendSpecDecodeBaseProposer._propose"


def _tree(name: str, version: str) -> pathlib.Path:
    try:
        return sdists.host_tree(name, version)
    except sdists.IndexUnreachable as exc:
        pytest.skip(f"no package index can be reached, so the {name}=={version} sdist is unavailable: "
                    f"{exc}")


@pytest.fixture(scope="module")
def hust() -> pathlib.Path:
    return _tree("vllm-hust", "0.17.2.post1")


@pytest.fixture(scope="module")
def ascend() -> pathlib.Path:
    return _tree("vllm-ascend", "0.23.0.post1")


@pytest.fixture(scope="module")
def vllm023() -> pathlib.Path:
    """vLLM 0.23.0, the release vllm-ascend 0.23.0.post1 follows (its pairing)."""
    return _tree("vllm", "0.23.0")


def run(*args: str) -> tuple[int, dict]:
    proc = subprocess.run([DOCTOR, "--json", *args], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] == (proc.returncode == 0)
    return proc.returncode, report


def test_cached_sdists_match_the_index_sha256(hust: pathlib.Path, ascend: pathlib.Path) -> None:
    for name, version in (("vllm-hust", "0.17.2.post1"), ("vllm-ascend", "0.23.0.post1")):
        path = sdists.fetch_sdist(name, version)
        stamp = json.loads((sdists.CACHE / f"{name}-{version}.json").read_text())
        assert path.name == f"{name.replace('-', '_')}-{version}.tar.gz"
        assert sdists._sha256(path) == stamp["digests"]["sha256"]
        assert len(stamp["digests"]["sha256"]) == 64


# ---------------------------------------------------------------- vLLM-HUST 0.17.2.post1

def test_hust_tree_is_detected(hust: pathlib.Path) -> None:
    rc, report = run("--vllm-root", str(hust), "--method", "eagle")
    (host,) = report["hosts"]
    assert (host["distribution"], host["version"]) == ("vllm-hust", "0.17.2.post1")
    assert host["version_source"] == str(hust / "PKG-INFO")
    assert host["git"] is None
    assert report["family"] == "vllm-hust"
    assert rc == 0  # the fixed-K path (drafter, plugin loading) is all there


HUST_PATCHES = ["hust-attach", "hust-step-k", "hust-spec-stats", "hust-step-output",
                "hust-draft-trim", "hust-async-placeholders", "hust-draft-k"]


def test_hust_017_has_every_symbol_of_its_patch_set(hust: pathlib.Path) -> None:
    """The 0.17 patch set (per-step K decided before ``_update_after_schedule`` and carried
    in a ``SchedulerOutput`` attribute, per-request K_i, the drafter's K in the worker):
    ``--adaptive`` over every method exits 0; the engine-core side also runs on the tree's
    scheduler (test_hust017_scheduler.py)."""
    rc, report = run("--vllm-root", str(hust), "--adaptive")
    assert rc == 0 and report["missing"] == []
    assert report["family"] == "vllm-hust"
    assert report["patches"][:len(HUST_PATCHES)] == HUST_PATCHES
    assert report["unchecked_methods"] == ["dflash", "dspark"]
    by_symbol = {c["symbol"]: c for c in report["checks"]}
    for ok in ("vllm.v1.core.sched.scheduler.Scheduler._update_after_schedule",
               "vllm.v1.core.sched.scheduler.Scheduler.update_draft_token_ids",
               "vllm.v1.core.sched.async_scheduler.AsyncScheduler._update_after_schedule",
               "vllm.v1.core.sched.async_scheduler.AsyncScheduler._spec_token_placeholders",
               "vllm.v1.core.sched.scheduler.Scheduler.make_spec_decoding_stats",
               "vllm.v1.worker.gpu_model_runner.GPUModelRunner.propose_draft_token_ids",
               "vllm.v1.spec_decode.eagle.SpecDecodeBaseProposer.num_speculative_tokens",
               "vllm.v1.spec_decode.ngram_proposer.NgramProposer.k"):
        assert by_symbol[ok]["status"] == "OK" and by_symbol[ok]["line"] > 0, ok
    # the vllm family's per-step K path is not asked of this host
    assert not set(PER_STEP_K_017 + [BASE_PROPOSE_K]) & set(by_symbol)
    # 0.17's V2 runner is opt-in; the worker wrap is on the V1 runner
    assert report["v2_runner"]["v1_only_patches"] == ["hust-draft-k"]


@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3", "mtp", "ngram"])
def test_hust_017_variable_k_methods_get_the_drafter_wrap(hust: pathlib.Path,
                                                           method: str) -> None:
    rc, report = run("--vllm-root", str(hust), "--method", method, "--adaptive")
    assert rc == 0 and report["missing"] == []
    assert report["patches"][:len(HUST_PATCHES)] == HUST_PATCHES
    assert report["unchecked_methods"] == []


@pytest.mark.parametrize("method", ["suffix", "medusa"])
def test_hust_017_fixed_k_methods_only_need_per_request_points(hust: pathlib.Path,
                                                               method: str) -> None:
    rc, report = run("--vllm-root", str(hust), "--method", method, "--adaptive")
    assert rc == 0 and report["missing"] == []
    assert "hust-draft-trim" in report["patches"]
    assert "hust-draft-k" not in report["patches"]


def test_hust_017_has_no_dflash(hust: pathlib.Path) -> None:
    for extra in ((), ("--adaptive",)):
        rc, report = run("--vllm-root", str(hust), "--method", "dflash", *extra)
        assert rc == 1 and report["missing"] == ["vllm.v1.spec_decode.dflash.DFlashProposer"]


# ---------------------------------------------------------------- vLLM-Ascend 0.23.0.post1

def test_ascend_tree_is_detected(ascend: pathlib.Path, vllm023: pathlib.Path) -> None:
    rc, report = run("--ascend-root", str(ascend), "--vllm-root", str(vllm023), "--method", "eagle")
    assert rc == 0
    assert report["family"] == "vllm-ascend"
    host = {h["package"]: h for h in report["hosts"]}["vllm_ascend"]
    assert (host["distribution"], host["version"]) == ("vllm-ascend", "0.23.0.post1")
    assert host["root"] == str(ascend / "vllm_ascend")


@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3", "mtp", "dflash"])
def test_ascend_023_proposer_takes_no_k(ascend: pathlib.Path, vllm023: pathlib.Path, method: str) -> None:
    rc, report = run("--ascend-root", str(ascend), "--vllm-root", str(vllm023), "--method", method, "--adaptive")
    assert rc == 1
    assert report["missing"] == [ASCEND_PROPOSE]
    check = next(c for c in report["checks"] if c["symbol"] == ASCEND_PROPOSE)
    assert check["detail"] == "parameter(s) missing: num_speculative_tokens"
    assert check["file"].endswith("vllm_ascend/spec_decode/llm_base_proposer.py")
    assert check["line"] == 728
    present = {c["symbol"] for c in report["checks"] if c["status"] == "OK"}
    assert "vllm_ascend.worker.model_runner_v1.NPUModelRunner._sample" in present
    assert "vllm_ascend.worker.worker.NPUWorker.take_draft_token_ids" in present


def test_ascend_023_ngram_branches(ascend: pathlib.Path, vllm023: pathlib.Path) -> None:
    rc, report = run("--ascend-root", str(ascend), "--vllm-root", str(vllm023), "--method", "ngram", "--adaptive")
    assert rc == 1
    assert report["missing"] == [
        "vllm_ascend.spec_decode.ngram_proposer.AscendNgramProposer.propose"]
    (check,) = [c for c in report["checks"] if c["status"] == "MISSING"]
    assert "of 2 conditional definitions" in check["detail"]


def test_ascend_023_fixed_k_is_complete_but_has_no_dspark(ascend: pathlib.Path, vllm023: pathlib.Path) -> None:
    for method in ("draft_model", "eagle", "ngram", "suffix", "medusa", "dflash"):
        rc, report = run("--ascend-root", str(ascend), "--vllm-root", str(vllm023), "--method", method)
        assert rc == 0, (method, report["missing"])
    rc, report = run("--ascend-root", str(ascend), "--vllm-root", str(vllm023), "--method", "dspark")
    assert rc == 1
    assert report["missing"] == [
        "vllm_ascend.spec_decode.dspark_proposer.AscendDSparkProposer"]


# ---------------------------------------------------------------- pairings

def test_ascend_023_imports_over_its_own_vllm(ascend: pathlib.Path, vllm023: pathlib.Path) -> None:
    rc, report = run("--ascend-root", str(ascend), "--vllm-root", str(vllm023), "--method", "eagle")
    assert rc == 0, report["pairing"]
    pairing = report["pairing"]
    assert pairing["ok"] and pairing["unresolved"] == []
    assert pairing["versions"] == {"vllm_ascend": "0.23.0.post1", "vllm": "0.23.0"}
    assert pairing["modules"] > 300 and pairing["imports_checked"] > 1500


def test_ascend_023_over_hust_017_fails_at_import(ascend: pathlib.Path, hust: pathlib.Path) -> None:
    """Every symbol our patches need is there, yet vllm_ascend cannot import over vLLM-HUST:
    the doctor fails with the versions and the first unresolved names."""
    rc, report = run("--ascend-root", str(ascend), "--vllm-root", str(hust), "--method", "eagle")
    assert rc == 1 and report["missing"] == []
    pairing = report["pairing"]
    assert not pairing["ok"] and pairing["unresolved_count"] >= 40
    assert pairing["versions"] == {"vllm_ascend": "0.23.0.post1", "vllm": "0.17.2.post1"}
    names = {(u["source"], u["name"]) for u in pairing["unresolved"]}
    assert ("vllm.v1.kv_cache_spec_registry", "KVCacheSpecRegistry") in names
    first = pairing["unresolved"][0]
    assert first["module"].startswith("vllm_ascend.") and first["line"] > 0
    proc = subprocess.run([DOCTOR, "--ascend-root", str(ascend), "--vllm-root", str(hust),
                           "--method", "eagle"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert ("pairing: vllm_ascend 0.23.0.post1 over vllm 0.17.2.post1: " in proc.stdout
            and "cannot import over this vllm tree" in proc.stdout)
    assert "UNRESOLVED vllm_ascend.core.kv_cache_interface:13: " \
        "vllm.v1.kv_cache_spec_registry.KVCacheSpecRegistry" in proc.stdout


# ---------------------------------------------------------------- vLLM 0.33.0

def test_vllm_033_has_every_symbol_the_patches_touch() -> None:
    """The newest vLLM on the index, checked statically (no 0.33 build runs here): every
    symbol and signature of the vllm-family patches, the adaptive ones included."""
    tree = _tree("vllm", "0.33.0")
    for extra in ((), ("--adaptive",)):
        rc, report = run("--vllm-root", str(tree), *extra)
        assert rc == 0, report["missing"]
        assert report["family"] == "vllm" and report["pairing"] is None
        host = report["hosts"][0]
        assert (host["distribution"], host["version"]) == ("vllm", "0.33.0")
    assert len(report["checks"]) >= 100
    # its V2 model runner (the CUDA default) runs none of the V1 runner's classes
    assert report["v2_runner"]["present"]
    assert {"drafter-k0", "eagle-k0", "draft-confidence-take", "lossy-accept"} <= set(
        report["v2_runner"]["v1_only_patches"])
    assert "scheduler-k" not in report["v2_runner"]["v1_only_patches"]
    assert report["models"]["qwen2_eagle"]["host_has"] == []


def test_the_covering_table_makes_vllm_033s_v2_runner_capture_every_k() -> None:
    """The batch-size table the plugin writes on V2, expanded by vLLM 0.33's own function
    (loaded from the sdist's source file alone: it imports nothing of vLLM) into the dense
    table whose widths V2's cudagraph manager captures (``cudagraph_utils.py``)."""
    import importlib.util

    from vllm_hust_vspec.capture import covering_table

    path = _tree("vllm", "0.33.0") / "vllm" / "v1" / "spec_decode" / "dynamic" / "utils.py"
    spec = importlib.util.spec_from_file_location("vllm033_dynamic_sd_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for kmin, kmax, seqs in ((0, 4, 256), (2, 6, 16), (0, 7, 8)):
        table, left_out = covering_table(kmin, kmax, seqs)
        dense = mod.build_dynamic_sd_schedule_lookup(table, seqs, kmax)
        assert {k + 1 for k in dense[1:]} == set(range(kmin + 1, kmax + 2)) and not left_out
    cg = (_tree("vllm", "0.33.0") / "vllm" / "v1" / "worker" / "gpu" / "cudagraph_utils.py").read_text()
    assert "num_spec + num_new_sampled_tokens_per_step" in cg  # the widths V2 captures


@pytest.mark.parametrize("where", ["installed", "0.33.0"])
def test_the_dspark_patch_set_is_checked_when_dspark_is_asked_for(where: str) -> None:
    """DSpark on the V1 runner (``dspark-inputs``, ``dspark-sample``): the installed 0.32 host
    and vLLM 0.33's tree have every symbol; a doctor run for another method does not check
    them (a host without vLLM's Qwen3 DSpark model cannot be asked for it)."""
    root = () if where == "installed" else ("--vllm-root", str(_tree("vllm", where)))
    rc, report = run(*root, "--method", "dspark", "--adaptive")
    assert rc == 0, report["missing"]
    dspark = [c for c in report["checks"] if c["patch"] in ("dspark-inputs", "dspark-sample")]
    assert {c["patch"] for c in dspark} == {"dspark-inputs", "dspark-sample"}
    assert all(c["status"] == "OK" for c in dspark), dspark
    rc, report = run(*root, "--method", "eagle")
    assert rc == 0 and not [c for c in report["checks"] if c["patch"].startswith("dspark-")]
