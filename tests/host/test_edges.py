"""Long contexts and edges, with the plugin on (issue 16 item 5): real vLLM, CPU, float32.

One plugin engine (draft model, Kmax 4, the ``sweep`` policy: K cycles 0..4 every step, with
K = 0 stretches) with ``max_model_len`` 160, against target-only under the same limits:

* requests that reach ``max_model_len`` while drafting (prompts of ~100-150 tokens, asked
  for more tokens than fit: vLLM stops them at the limit);
* a prompt of one token, and requests with ``max_tokens`` 1;
* two bursts with the engine idle between them (empty batches);
* one request whose K_i is 0 for its whole life, beside others that draft: the runtime's
  decision gate limits it to 0 drafts every step (the test wraps the plugin's own gate; no
  part of vLLM is imitated).

Each output equals target-only token for token; the K_i = 0 request had no draft verified;
the controller's drafted and accepted totals equal what the host reported per request and
what the decision trace's results say.
"""

from __future__ import annotations

import time

import pytest

from plugin_helpers import close, engine_spec, make_llm, plugin_env, read_decisions, runtime_of

pytestmark = [pytest.mark.host, pytest.mark.slow]

KMAX = 4
MAX_MODEL_LEN = 160
SWEEP = [0] * 8 + [1, 2, 3, 4] + [0] + [4, 2, 4, 1, 3] + [0] * 3 + [4, 4]


def _requests(fixtures_dir):
    """(prompt token ids, max_tokens) of each request, and the index of the K_i = 0 one."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(fixtures_dir / "target"))
    code = [line for line in (fixtures_dir / "prompts" / "code.jsonl").read_text().splitlines()
            if line.strip()]
    import json
    texts = [json.loads(line)["prompt"] for line in code]
    long = [tok.encode(t)[:140 - 10 * i] for i, t in enumerate(texts[:3])]  # 140, 130, 120
    short = [tok.encode(t)[:12] for t in texts[3:6]]
    reqs = [(ids, MAX_MODEL_LEN) for ids in long]  # more than fits: stopped at the limit
    reqs += [([short[0][0]], 40), (short[1], 1), (short[2], 1), (short[0], 40)]
    return reqs, len(reqs) - 1  # the last short one sits out drafting all its life


def _generate(llm, reqs):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids, _ in reqs]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in reqs]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _bursts(llm, reqs):
    first = _generate(llm, reqs[:4])
    time.sleep(1.0)  # the engine idles: empty batches between the bursts
    return first + _generate(llm, reqs[4:])


def test_edges_are_lossless_and_counted(fixtures_dir, tmp_path):
    reqs, sitter = _requests(fixtures_dir)
    model, spec = engine_spec(fixtures_dir, "draft_model", KMAX)
    with plugin_env(enabled=False):
        llm = make_llm(model, max_model_len=MAX_MODEL_LEN)
        try:
            expected = _bursts(llm, reqs)
        finally:
            close(llm)
    trace = tmp_path / "decisions.jsonl"
    with plugin_env(adaptive_policy="sweep", adaptive_sweep=SWEEP, adaptive_trace_file=trace):
        llm = make_llm(model, spec, max_model_len=MAX_MODEL_LEN)
        try:
            rt = runtime_of(llm)
            sitter_ids = list(reqs[sitter][0])
            sitter_rid: list[str] = []
            decide = rt.gate.decide

            def gate_decide(step, running, *args):
                d = decide(step, running, *args)
                for r in running:
                    if list(r.prompt_token_ids) == sitter_ids and r.request_id not in sitter_rid:
                        sitter_rid.append(r.request_id)
                limits = dict(d.limits or {})
                for r in running:
                    if r.request_id in sitter_rid:
                        limits[r.request_id] = 0
                rt.gate.limits = limits or None
                return type(d)(k=d.k, k_host=d.k_host, limits=rt.gate.limits)

            rt.gate.decide = gate_decide
            per_request: dict[str, list[int]] = {}
            on_verified = rt.on_verified

            def verified(req_id, drafted, accepted, invalid=None):
                per_request.setdefault(req_id, [0, 0])
                per_request[req_id][0] += drafted - (invalid or {}).get(req_id, 0)
                per_request[req_id][1] += accepted
                return on_verified(req_id, drafted, accepted, invalid)

            rt.on_verified = verified
            got = _bursts(llm, reqs)
            totals = (rt.controller.drafted_total, rt.controller.accepted_total)
        finally:
            close(llm)
    assert got == expected
    # the long requests stopped at max_model_len while the sweep drafted
    for (ids, _), out in zip(reqs[:3], got[:3]):
        assert len(ids) + len(out) == MAX_MODEL_LEN
    assert [len(o) for o in got[3:]] == [40, 1, 1, 40]
    assert len(sitter_rid) == 1 and sitter_rid[0] not in per_request  # no draft verified
    assert sum(v[0] for v in per_request.values()) == totals[0] > 0
    assert sum(v[1] for v in per_request.values()) == totals[1]
    _, decisions, results = read_decisions(trace)
    assert sum(r["drafted"] for r in results) == totals[0]
    assert sum(r["accepted"] for r in results) == totals[1]
    assert {d["k"] for d in decisions} == set(range(KMAX + 1))
