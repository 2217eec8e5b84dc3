"""The soak's RSS check takes its warmed-up value when the traffic's first quarter is sent,
not only after the first quarter of ``--duration``: CI's Xeon served the soak's 500 requests
in less than 60 of its 240 seconds, no sample fell past the mark, and both policies failed
``rss steady`` with nothing measured ("n/a").

The engine core here is a real process named like vLLM's (a ``sleep`` started through a link
called ``VLLM::EngineCore``); the server object is a stand-in that only carries that pid's
parent, which is all :class:`RssSampler` reads of it."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess

import pytest

from vllm_hust_vspec.tools.bench_soak import ENGINE_CORE, RssSampler, _checks, engine_rss


@dataclasses.dataclass
class _Parent:
    pid: int


@pytest.fixture
def engine_core(tmp_path: pathlib.Path):
    link = tmp_path / ENGINE_CORE
    link.symlink_to(shutil.which("sleep"))
    proc = subprocess.Popen([str(link), "60"])
    try:
        yield _Parent(os.getpid())
    finally:
        proc.kill()
        proc.wait()


def test_engine_rss_finds_the_engine_core(engine_core) -> None:
    rss = engine_rss(engine_core)
    assert set(rss) == {ENGINE_CORE} and rss[ENGINE_CORE] > 0


def test_the_warm_value_comes_from_the_request_mark(engine_core) -> None:
    # the duration's first quarter never passes: only the request mark can give the value
    with RssSampler(engine_core, warm_s=1e6, interval=60) as rss:
        assert rss.warm == {}
        rss.mark_warm()
        first = dict(rss.warm)
        rss.mark_warm()  # once: a later mark does not move it
        assert rss.warm == first
    assert set(first) == {ENGINE_CORE} and first[ENGINE_CORE] > 0
    assert rss.end and rss.end[ENGINE_CORE] > 0


def test_without_a_warm_value_the_check_fails(engine_core) -> None:
    with RssSampler(engine_core, warm_s=1e6, interval=60) as rss:
        pass
    assert rss.warm == {} and rss.end  # the end sample alone is no warmed-up value
    summary = {"rss_warm": rss.warm, "rss_end": rss.end, "mismatches": 0, "lost": 0,
               "duplicated": 0, "completed": 1, "cancelled": 1, "requests": 1,
               "preemptions": 1, "running_at_end": 0, "waiting_at_end": 0,
               "server_alive_at_end": True, "fallbacks": 0, "faults_injected": 0}
    assert _checks(summary, 0.10)["rss steady"] is False
    grown = summary | {"rss_warm": {ENGINE_CORE: 100}, "rss_end": {ENGINE_CORE: 111}}
    assert _checks(grown, 0.10)["rss steady"] is False
    assert _checks(grown | {"rss_end": {ENGINE_CORE: 109}}, 0.10)["rss steady"] is True
