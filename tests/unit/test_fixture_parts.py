"""Pure parts of the fixture builder: widening keeps the function, MiMo layout, params, prompts."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

pytestmark = pytest.mark.unit

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))

from fixtures import convert as CV  # noqa: E402
from fixtures import params as P  # noqa: E402
from fixtures import prompts as PR  # noqa: E402
from fixtures import store  # noqa: E402


def _mlp_state(hidden: int = 8, inter: int = 12):
    import torch

    g = torch.Generator().manual_seed(0)
    return {
        "model.layers.0.mlp.gate_proj.weight": torch.randn(inter, hidden, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(inter, hidden, generator=g),
        "model.layers.0.mlp.down_proj.weight": torch.randn(hidden, inter, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(hidden, hidden, generator=g),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(4, hidden, generator=g),
        "model.layers.0.self_attn.v_proj.weight": torch.randn(4, hidden, generator=g),
    }


def _mlp(state, x):
    import torch.nn.functional as F

    g, u, d = (state[f"model.layers.0.mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
    return (F.silu(x @ g.T) * (x @ u.T)) @ d.T


def test_widen_mlps_keeps_the_function() -> None:
    import torch

    state = _mlp_state()
    wide = CV.widen_mlps(state, 40)
    assert wide["model.layers.0.mlp.gate_proj.weight"].shape == (40, 8)
    assert wide["model.layers.0.mlp.down_proj.weight"].shape == (8, 40)
    assert torch.equal(wide["model.layers.0.self_attn.q_proj.weight"], state["model.layers.0.self_attn.q_proj.weight"])
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_mlp(wide, x), _mlp(state, x), atol=1e-5, rtol=1e-6)
    assert CV.num_params(wide) > CV.num_params(state)


def test_widen_mlps_refuses_to_narrow() -> None:
    with pytest.raises(ValueError, match="gate_proj.*cannot narrow 12 -> 10"):
        CV.widen_mlps(_mlp_state(), 10)


def test_llama_to_mimo_adds_zero_qkv_biases_and_the_mtp_layer() -> None:
    import torch

    state = _mlp_state()
    mtp = {"model.mtp_layers.0.input_proj.weight": torch.ones(8, 16)}
    out = CV.llama_to_mimo(state, mtp)
    for proj, rows in (("q", 8), ("k", 4), ("v", 4)):
        bias = out[f"model.layers.0.self_attn.{proj}_proj.bias"]
        assert bias.shape == (rows,) and not bias.any()
    assert "model.layers.0.self_attn.o_proj.bias" not in out
    assert torch.equal(out["model.mtp_layers.0.input_proj.weight"], mtp["model.mtp_layers.0.input_proj.weight"])
    with pytest.raises(ValueError, match="collides"):
        CV.llama_to_mimo(state, {"model.layers.0.mlp.up_proj.weight": torch.ones(1)})


def test_params_budgets_and_hash() -> None:
    full, quick = P.BuildParams(), P.BuildParams(scale=P.QUICK_SCALE)
    assert full.target_steps == P.FULL_TARGET_STEPS and full.head_steps == P.FULL_DRAFTER_STEPS
    assert full.precision == P.auto_precision()
    assert P.BuildParams(precision="bf16").as_dict()["precision"] == "bf16 autocast, fp32 weights"
    assert P.BuildParams(precision="fp32").as_dict()["precision"] == "float32"
    assert quick.target_steps < full.target_steps
    assert P.BuildParams(scale=1e-6).target_steps == 1
    assert P.build_hash(full) == P.build_hash(P.BuildParams())
    assert len({P.build_hash(p) for p in (full, quick, P.BuildParams(seed=1), P.BuildParams(measure_mal=False),
                                          P.BuildParams(large_intermediate=8192), P.BuildParams(threads=1),
                                          P.BuildParams(precision="fp32" if full.precision == "bf16" else "bf16"))}) == 7
    # the kernels are in the hash: an AMX build is not the reference's build
    amx, avx = P.BuildParams(precision="bf16", kernels="amx_bf16"), P.BuildParams(precision="bf16", kernels="avx512_bf16")
    assert P.build_hash(amx) != P.build_hash(avx) and amx.as_dict()["kernels"] == "amx_bf16"
    assert full.kernels == P.kernels_of(full.precision)
    with pytest.raises(ValueError, match="kernels 'fp32' do not run a bf16 build"):
        P.BuildParams(precision="bf16", kernels="fp32")
    with pytest.raises(ValueError, match="kernels 'amx_bf16' do not run a fp32 build"):
        P.BuildParams(precision="fp32", kernels="amx_bf16")
    with pytest.raises(ValueError, match="--scale"):
        P.BuildParams(scale=0)
    with pytest.raises(ValueError, match="--precision"):
        P.BuildParams(precision="fp16")
    with pytest.raises(ValueError, match="--threads"):
        P.BuildParams(threads=0)
    assert P.BUILDER_SCRIPT in P.source_files() and len(P.source_files()) > 5


def test_guarantee_only_at_the_full_budget() -> None:
    promise = P.guarantee(P.BuildParams(precision="bf16", kernels=P.REFERENCE_KERNELS))
    assert promise["mal_k4_reference"] == P.REFERENCE_MAL
    assert promise["mal_k4_relative_tolerance"] == P.MAL_TOLERANCE
    assert P.MAL_TOLERANCE["code"] == P.MAL_TOLERANCE["prose"] == 0.05 and P.MAL_TOLERANCE["hard"] <= 0.10
    # the promise holds whatever the thread count
    ref = {"precision": "bf16", "kernels": P.REFERENCE_KERNELS}
    assert P.guarantee(P.BuildParams(threads=1, **ref)) == promise
    assert P.guarantee(P.BuildParams(large_intermediate=8192, **ref)) == promise
    # other kernels are another draw: a looser promise
    for kw in ({"precision": "fp32"}, {"precision": "bf16", "kernels": "amx_bf16"},
               {"precision": "bf16", "kernels": "emulated_bf16"}):
        draw = P.guarantee(P.BuildParams(**kw))
        assert draw["mal_k4_reference"] == P.REFERENCE_MAL, kw
        assert draw["mal_k4_relative_tolerance"] == P.DRAW_MAL_TOLERANCE == {"code": 0.25, "prose": 0.25, "hard": 0.25}
        assert P.KERNELS[P.BuildParams(**kw).kernels] in draw["holds"]
    assert P.precision_key("float32") == "fp32" and P.precision_key("bf16 autocast, fp32 weights") == "bf16"
    for other in (P.BuildParams(scale=P.QUICK_SCALE), P.BuildParams(seed=1), P.BuildParams(measure_mal=False)):
        assert P.guarantee(other) is None


def test_check_quality_names_every_miss() -> None:
    promise = {"mal_k4_reference": {"draft": {"code": 3.0, "hard": 2.0}, "eagle": {"code": 3.0, "hard": 2.0}},
               "mal_k4_relative_tolerance": {"code": 0.05, "hard": 0.05}, "hard_below_code": 0.5}
    ok = P.check_quality({"draft": {"code": 3.14, "hard": 2.09}, "eagle": {"code": 2.86, "hard": 1.91}}, promise)
    assert ok == {"ok": True, "failures": []}
    bad = P.check_quality({"draft": {"code": 3.2, "hard": 2.0}, "eagle": {"code": 2.9}}, promise)
    assert not bad["ok"]
    assert bad["failures"] == ["draft MAL on code 3.2 not within 5% of 3.0",
                               "eagle MAL on hard None not within 5% of 2.0"]
    near = {**promise, "mal_k4_reference": {"draft": {"code": 3.0, "hard": 2.4}}}
    close = P.check_quality({"draft": {"code": 2.86, "hard": 2.45}}, near)
    assert close["failures"] == ["draft MAL hard 2.45 not below code 2.86 by 0.5"]


def test_prompt_sets_format(tmp_path: pathlib.Path) -> None:
    valid = ["\n".join(f"x_{i} = {i} + value_{i}" for i in range(80))]
    prose = ["word " * 80 + f"end{i}" for i in range(40)]
    sets = PR.build(valid, prose, ["ab", "cd", "ef"], "alpha beta gamma delta_epsilon", seed=3)
    assert sets == PR.build(valid, prose, ["ab", "cd", "ef"], "alpha beta gamma delta_epsilon", seed=3)
    PR.write(sets, tmp_path)
    for name in ("code", "prose", "hard"):
        rows = PR.read(tmp_path / f"{name}.jsonl")
        assert len(rows) == PR.N_PROMPTS
        assert all(r["output_tokens"] == PR.OUTPUT_TOKENS[name] for r in rows)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: need"):
        PR.read(bad)


def test_store_publish_and_current(tmp_path: pathlib.Path) -> None:
    tmp = store.temp_dir(tmp_path, "abc")
    (tmp / store.MANIFEST).write_text('{"stage": "base"}')
    final = tmp_path / "abc"
    assert store.stage_of(final) is None and not store.has_stage(final, "base")
    store.publish(tmp, final)
    assert store.has_stage(final, "base") and not store.has_stage(final, "full") and not tmp.exists()
    (final / store.MANIFEST).write_text('{"stage": "full"}')
    assert store.has_stage(final, "base") and store.has_stage(final, "full")
    (final / store.MANIFEST).write_text("{}")  # format 1: always complete
    assert store.stage_of(final) == "full"
    link = store.point_current(tmp_path, final)
    assert link.is_symlink() and link.resolve() == final.resolve()
    other = tmp_path / "def"
    other.mkdir()
    store.point_current(tmp_path, other)
    assert (tmp_path / "current").resolve() == other.resolve()


def test_precision_follows_the_cpus_bf16_flags() -> None:
    """``--precision auto`` trains in bf16 only where the CPU has it natively (an emulated
    bf16 step cost 18x a float32 one on an AVX2-only CPU)."""
    assert P.native_bf16("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n")
    assert P.native_bf16("flags\t: avx2 amx_bf16 amx_tile\n")
    assert P.native_bf16("Features\t: fp asimd bf16 i8mm\n")  # Arm
    assert not P.native_bf16("flags\t\t: fpu sse avx2 avx512f avx512bw\n")
    assert not P.native_bf16("Features\t: fp asimd sve\n")
    assert not P.native_bf16("")
    # which kernels a bf16 build runs on: oneDNN takes AMX where the CPU has it
    assert P.kernels_of("bf16", "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n") == "amx_bf16"
    assert P.kernels_of("bf16", "flags\t\t: fpu sse avx2 avx512f avx512_bf16\n") == "avx512_bf16"
    # an Intel CPU's AVX-512 BF16 is its own path (other bits than the AMD references)
    intel = "vendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_fp16\n"
    assert P.cpu_vendor(intel) == "GenuineIntel" and P.kernels_of("bf16", intel) == "intel_avx512_bf16"
    amd = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
    assert P.kernels_of("bf16", amd) == "avx512_bf16"
    assert P.kernels_of("bf16", "vendor_id\t: GenuineIntel\nflags\t\t: avx512_bf16 amx_bf16\n") == "amx_bf16"
    assert P.kernels_of("bf16", "Features\t: fp asimd bf16 i8mm\n") == "arm_bf16"
    assert P.kernels_of("bf16", "flags\t\t: fpu sse avx2\n") == "emulated_bf16"
    assert P.kernels_of("fp32", "flags\t\t: avx512_bf16 amx_bf16\n") == "fp32"
