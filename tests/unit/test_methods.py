"""The method table follows the host's files (methods.host_lacks): Medusa is gone from
vLLM 0.33, present in this host's 0.32."""

from __future__ import annotations

import pathlib

import pytest

from vllm_hust_vspec import methods

pytestmark = pytest.mark.unit


def _tree(tmp_path: pathlib.Path, files: tuple[str, ...]) -> pathlib.Path:
    root = tmp_path / "vllm"
    for name in files:
        path = root / "v1" / "spec_decode" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return root


def test_medusa_follows_the_hosts_tree(tmp_path):
    without = _tree(tmp_path / "a", ("eagle.py",))
    why = methods.host_lacks("medusa", without)
    assert why is not None and "medusa" in why and "0.33" in why
    assert methods.host_lacks("medusa", _tree(tmp_path / "b", ("medusa.py",))) is None
    assert methods.host_lacks("eagle", without) is None  # no file rule for it


def test_this_hosts_medusa_is_there():
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    assert methods.host_lacks("medusa", root) is None


def test_a_dspark_draft_on_the_v1_dflash_proposer_is_served_as_dspark():
    from types import SimpleNamespace

    def spec(method, **hf):
        return SimpleNamespace(method=method, draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(**hf)))

    assert methods.served_method(spec("dflash", hust_dspark=True)) == "dspark"
    assert methods.served_method(spec("dflash")) == "dflash"
    assert methods.served_method(spec("eagle3", hust_dspark=True)) == "eagle3"
    assert methods.served_method(SimpleNamespace(method="ngram", draft_model_config=None)) == "ngram"
