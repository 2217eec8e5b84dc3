"""The lossy acceptance rules' settings, labels and active line (runtime/lossy_accept.py's
mechanism runs on the real host: tests/host/test_lossy_accept.py)."""

from __future__ import annotations

import pytest

from vllm_hust_vspec import settings as S
from vllm_hust_vspec.runtime.announce import active_line
from vllm_hust_vspec.runtime.lossy_accept import Rules


def test_strict_by_default_and_labels_name_each_rule():
    assert S.lossy_rules(S.Settings()) == ()
    s = S.Settings({"eagle_relaxed_accept_topk": 3, "confidence_accept_margin": 0.5,
                    "confidence_accept_from_position": 2})
    assert S.lossy_rules(s) == ("relaxed-top3", "margin0.5-from2")


def test_relaxed_top_k_is_eagles_only_in_the_rules():
    s = S.Settings({"eagle_relaxed_accept_topk": 2})
    assert Rules.from_settings(s, "eagle3").lossy
    assert not Rules.from_settings(s, "draft_model").lossy
    m = S.Settings({"confidence_accept_margin": 1.0, "confidence_protected_token_ids": (2, 7)})
    assert Rules.from_settings(m, "ngram") == Rules(margin=1.0, protected=(2, 7))


@pytest.mark.parametrize("name", ["eagle_relaxed_accept_after_tokens",
                                  "confidence_accept_from_position",
                                  "confidence_accept_after_tokens"])
def test_tuning_without_its_rule_is_an_error(name):
    with pytest.raises(S.SettingsError, match=f"{name}.*not set: verification is strict"):
        S.validate(S.Settings({name: 3}))


def test_the_active_line_says_lossy_only_when_lossy():
    strict = active_line("h", "engine", "online", 4, ["a"])
    assert "acceptance" not in strict and strict.endswith("kmax=4 patches=[a]")
    lossy = active_line("h", "engine", "online", 4, ["a"], ("relaxed-top2",))
    assert "kmax=4 acceptance=LOSSY(relaxed-top2) patches=[a]" in lossy
