"""``vllm-hust-vspec-bench soak``: real traffic against a plugin server, every token checked.

For each policy (``online``, ``budget``, ``sweep``: a per-step sweep through every K in
0..Kmax with long K = 0 stretches) one real multiprocess server is started through the
launcher, with a KV cache small enough that vLLM preempts and recomputes requests that hold
drafts (``--kv-blocks``; the budget policy's start-up cost table is measured first by a
server with the arguments' own KV cache, and loaded).  ``--clients`` streaming clients (loopback only) send greedy
completions for ``--duration`` seconds or ``--max-requests`` requests: prompts of mixed
lengths, mixed ``max_tokens``, stop strings, and ``--cancel-fraction`` of them hung up by the
client mid-stream.  Before that, one target-only server (the same preset without
speculation, the same KV cache) answers every distinct request once: the reference.

Checked per policy: every completed request's text equals the reference (a divergence is
excused only at a proven near-tie: the reference's top-2 log-probabilities at the diverging
token closer than ``NEAR_TIE``), every cancelled request's partial text is a prefix of it;
no request lost (an error or no end), none answered twice (two finish reasons); vLLM's
running and waiting counts back at 0 at the end; vLLM's preemption count > 0; the engine
core's RSS at the end within ``--rss-tolerance`` of its value after warm-up (the first
quarter of the traffic); the worker's is reported beside it.  ``--inject-fault-at STEP`` runs
a fault drill on every plugin server (the controller raises at that step): the server must
fall back to its safe K (one fallback on ``/metrics``) and pass every check above.  The summary
(``soak.json`` and a table) says each; the exit status is 1 when any check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import pathlib
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.fileio import write_atomic

from .bench_configs import BenchConfig
from .bench_server import (Server, ServerCommand, plugin_command, resolve_base,
                           server_command)
from .bench_workloads import jsonl_records

POLICIES = ("online", "budget", "sweep")
WARM_SHARE = 0.25  # the RSS after this share of the traffic (duration or requests) is the warmed-up value
NEAR_TIE = 1e-4  # log-probability gap under which two tokens are a tie (float32)
MAX_TOKENS = (1, 8, 24, 64)
STOPS = (None, ["\n\n"], ["return", "\n#"])


class SoakError(VspecError, ValueError):
    """Bad soak input, reported before any server starts."""


@dataclasses.dataclass(frozen=True)
class Job:
    """One distinct request of the pool (a soak request repeats one of them)."""

    index: int
    prompt: str
    max_tokens: int
    stop: list[str] | None

    def body(self, model: str, stream: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"model": model, "prompt": self.prompt,
                               "max_tokens": self.max_tokens, "temperature": 0.0,
                               "stream": stream}
        if self.stop:
            out["stop"] = self.stop
        return out


@dataclasses.dataclass
class Reference:
    text: str
    offsets: list[int]  # each token's character offset in text
    gaps: list[float]  # each token's top-1 minus top-2 log-probability

    def near_tie_at(self, char: int) -> float | None:
        """The gap at the token that holds character ``char`` (None past the end)."""
        j = None
        for i, off in enumerate(self.offsets):
            if off <= char:
                j = i
        return None if j is None or j >= len(self.gaps) else self.gaps[j]


@dataclasses.dataclass
class Outcome:
    job: int
    text: str
    finishes: int  # finish reasons received
    cancelled: bool
    error: str | None = None


# --------------------------------------------------------------------------- arguments


def add_soak_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", default="online,budget,sweep",
                   help="comma list of " + ", ".join(POLICIES) + " (default: all)")
    p.add_argument("--duration", type=float, default=600.0,
                   help="seconds of traffic per policy (default 600)")
    p.add_argument("--max-requests", type=int, default=None,
                   help="stop a policy's traffic after this many requests")
    p.add_argument("--clients", type=int, default=32, help="concurrent streaming clients")
    p.add_argument("--cancel-fraction", type=float, default=0.1,
                   help="share of requests the client hangs up mid-stream (default 0.1)")
    p.add_argument("--kv-blocks", type=int, default=10,
                   help="KV cache blocks of every server (vLLM --num-gpu-blocks-override); "
                        "small, so that vLLM preempts (default 10; the CPU host's blocks hold 128 tokens)")
    p.add_argument("--pool", type=int, default=48, help="distinct requests (default 48)")
    p.add_argument("--prompts-dir", default=None,
                   help="directory of *.jsonl prompt sets (default: the fixtures' prompts)")
    p.add_argument("--rss-tolerance", type=float, default=0.10,
                   help="engine-core RSS growth allowed after warm-up (default 0.10)")
    p.add_argument("--inject-fault-at", type=int, default=0, metavar="STEP",
                   help="fault drill on every plugin server: the controller raises at this "
                        "decision step (--adaptive-inject-fault); the server must fall back "
                        "and keep every token exact (default 0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="soak-results")
    p.add_argument("--startup-timeout", type=float, default=900.0)


def _policies(text: str) -> list[str]:
    out = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in out if p not in POLICIES]
    if not out or bad:
        raise SoakError(f"--policies {text!r}: choose from {', '.join(POLICIES)}")
    return out


def _check_args(a: argparse.Namespace) -> None:
    if a.duration <= 0 or a.clients < 1 or a.pool < 1 or a.kv_blocks < 2:
        raise SoakError("--duration, --clients, --pool and --kv-blocks must be positive "
                        "(--kv-blocks >= 2)")
    if not 0.0 <= a.cancel_fraction < 1.0:
        raise SoakError(f"--cancel-fraction {a.cancel_fraction}: must be in [0, 1)")
    if a.inject_fault_at < 0:
        raise SoakError(f"--inject-fault-at {a.inject_fault_at}: must be >= 0")
    if a.max_requests is not None and a.max_requests < 1:
        raise SoakError("--max-requests must be >= 1")


def _prompts(directory: pathlib.Path) -> list[str]:
    files = sorted(directory.glob("*.jsonl"))
    if not files:
        raise SoakError(f"--prompts-dir {directory}: no *.jsonl prompt sets")
    out = []
    for path in files:  # JSON lines of {"prompt": str, ...}, as every prompt set
        for n, rec in jsonl_records(path):
            prompt = rec.get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise SoakError(f"{path}:{n}: no 'prompt' string")
            out.append(prompt)
    return out


def build_pool(prompts: Sequence[str], n: int, seed: int) -> list[Job]:
    """``n`` distinct requests: prompts cut to mixed lengths (a few characters to whole),
    every ``max_tokens`` of :data:`MAX_TOKENS`, with and without stop strings."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        prompt = rng.choice(list(prompts))
        cut = rng.choice((1.0, 1.0, 0.5, 0.2, 0.05))
        prompt = prompt[:max(1, int(len(prompt) * cut))]
        jobs.append(Job(i, prompt, MAX_TOKENS[i % len(MAX_TOKENS)],
                        STOPS[(i // len(MAX_TOKENS)) % len(STOPS)]))
    return jobs


def sweep_pattern(kmax: int) -> list[int]:
    """Every K in 0..Kmax, up and down and jumping, between K = 0 stretches of 1, 8 and 64
    steps."""
    up = list(range(1, kmax + 1))
    return [0] * 64 + up + [0] * 8 + up[::-1] + [0] + [kmax, 1] * 2 + [0] * 8 + up


# --------------------------------------------------------------------------- traffic


async def _stream(session: Any, url: str, body: dict[str, Any], cancel_after: int | None,
                  job: int) -> Outcome:
    text, finishes, chunks = [], 0, 0
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                return Outcome(job, "", 0, False, f"HTTP {resp.status}")
            async for raw in resp.content:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                choice = json.loads(data)["choices"][0]
                text.append(choice.get("text") or "")
                if choice.get("finish_reason") is not None:
                    finishes += 1
                chunks += 1
                if cancel_after is not None and chunks >= cancel_after and not finishes:
                    resp.close()  # the client hangs up: vLLM aborts the request
                    return Outcome(job, "".join(text), finishes, True)
    except Exception as exc:  # noqa: BLE001 (a lost request, reported)
        return Outcome(job, "".join(text), finishes, False, f"{type(exc).__name__}: {exc}")
    return Outcome(job, "".join(text), finishes, False)


async def _traffic(url: str, model: str, jobs: list[Job], a: argparse.Namespace,
                   seed: int, on_warm: Callable[[], None] = lambda: None) -> list[Outcome]:
    """The clients' requests until the duration or ``--max-requests`` runs out; ``on_warm``
    is called once, when the warm-up share of ``--max-requests`` has been sent."""
    import aiohttp

    rng = random.Random(seed)
    deadline = time.monotonic() + a.duration
    budget = [a.max_requests if a.max_requests is not None else 1 << 62]
    warm_at = budget[0] - max(1, round(WARM_SHARE * budget[0]))
    outcomes: list[Outcome] = []

    async def client() -> None:
        # a new connection per request: a kept-alive one that the server closes as the
        # next request goes out fails on the client's side (ServerDisconnectedError), and
        # would be counted as a request the server lost
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                         connector=aiohttp.TCPConnector(force_close=True)) as s:
            while time.monotonic() < deadline and budget[0] > 0:
                budget[0] -= 1
                if budget[0] == warm_at:
                    on_warm()
                job = rng.choice(jobs)
                cancel = rng.randint(1, 4) if rng.random() < a.cancel_fraction else None
                outcomes.append(await _stream(s, url, job.body(model, True), cancel, job.index))

    await asyncio.gather(*(client() for _ in range(a.clients)))
    return outcomes


def _references(url: str, model: str, jobs: list[Job], clients: int) -> dict[int, Reference]:
    import urllib.request

    def one(job: Job) -> tuple[int, Reference]:
        body = job.body(model, False) | {"logprobs": 2}
        req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:  # noqa: S310 (loopback)
            choice = json.loads(resp.read())["choices"][0]
        lp = choice.get("logprobs") or {}
        gaps = []
        for top in lp.get("top_logprobs") or []:
            vals = sorted((top or {}).values(), reverse=True)
            gaps.append(vals[0] - vals[1] if len(vals) > 1 else float("inf"))
        return job.index, Reference(choice["text"], list(lp.get("text_offset") or []), gaps)

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(1, min(clients, 8))) as pool:
        return dict(pool.map(one, jobs))


# --------------------------------------------------------------------------- checks


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(outcomes: list[Outcome], refs: dict[int, Reference]) -> dict[str, Any]:
    """Each outcome against its reference: counts, and the mismatches (at most 10 shown)."""
    out: dict[str, Any] = {"requests": len(outcomes), "completed": 0, "cancelled": 0,
                           "lost": 0, "duplicated": 0, "characters_compared": 0,
                           "mismatches": 0, "near_ties": [], "examples": []}
    for o in outcomes:
        ref = refs[o.job]
        if o.error is not None or (not o.cancelled and o.finishes == 0):
            out["lost"] += 1
            out["examples"].append({"job": o.job, "lost": o.error or "no finish reason"})
            continue
        if o.finishes > 1:
            out["duplicated"] += 1
        out["cancelled" if o.cancelled else "completed"] += 1
        expected = ref.text[:len(o.text)] if o.cancelled else ref.text
        out["characters_compared"] += len(o.text)
        if o.text == expected:
            continue
        at = _first_difference(o.text, ref.text)
        gap = ref.near_tie_at(at)
        if gap is not None and gap < NEAR_TIE:
            out["near_ties"].append(round(gap, 7))
            continue
        out["mismatches"] += 1
        if len(out["examples"]) < 10:
            out["examples"].append({"job": o.job, "at": at, "gap": gap,
                                    "got": o.text[max(0, at - 20):at + 20],
                                    "want": ref.text[max(0, at - 20):at + 20]})
    return out


def scrape(url: str) -> dict[str, float]:
    """vLLM's own counts on ``/metrics`` (summed over labels) and the plugin's fallbacks."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:  # noqa: S310
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


# vLLM's process titles: the engine core (scheduler, the plugin's controller: checked) and
# the CPU host's model-runner worker (reported: its RSS grows under any traffic on the CPU
# host, plugin off too, docs/benchmarks.md)
ENGINE_CORE = "VLLM::EngineCore"
ENGINE_PROCESSES = (ENGINE_CORE, "VLLM::Worker")


def engine_rss(server: Server) -> dict[str, int]:
    """The RSS (bytes) of the server's engine core and worker processes, by process title."""
    import psutil

    out: dict[str, int] = {}
    if server.pid is None:
        return out
    try:
        for kid in psutil.Process(server.pid).children(recursive=True):
            name = kid.name()
            if name in ENGINE_PROCESSES:
                out[name] = out.get(name, 0) + kid.memory_info().rss
    except psutil.Error:
        pass
    return out


class RssSampler:
    """Samples :func:`engine_rss` every ``interval`` seconds in a thread: the value after
    warm-up (the first sample past ``warm_s``, or the one :meth:`mark_warm` takes when the
    traffic has sent its warm-up share of requests first: a fast machine serves
    ``--max-requests`` in less than the duration's first quarter) and the last."""

    def __init__(self, server: Server, warm_s: float, interval: float = 5.0) -> None:
        import threading

        self.server, self.warm_s, self.interval = server, warm_s, interval
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._warm: dict[str, int] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic() - self._t0, engine_rss(self.server)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            t, rss = time.monotonic() - self._t0, engine_rss(self.server)
            self.samples.append((t, rss))
            if t >= self.warm_s:
                self._set_warm(rss)

    def mark_warm(self) -> None:
        """The traffic's warm-up share is sent: take the warmed-up value now (once)."""
        self._set_warm(engine_rss(self.server))

    def _set_warm(self, rss: dict[str, int]) -> None:
        with self._lock:
            if self._warm is None and rss:
                self._warm = rss

    @property
    def warm(self) -> dict[str, int]:
        return self._warm or {}

    @property
    def end(self) -> dict[str, int]:
        return self.samples[-1][1] if self.samples else {}


def _at_rest(url: str, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        if (m.get("vllm:num_requests_running", 0) == 0
                and m.get("vllm:num_requests_waiting", 0) == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.5)


# --------------------------------------------------------------------------- run


def _launcher_args(extra: Sequence[str], kv_blocks: int) -> list[str]:
    args = list(extra)
    if "--" not in args:
        args.append("--")
    return args + ["--num-gpu-blocks-override", str(kv_blocks)]


def _policy_flags(policy: str, kmax: int, inject_at: int = 0,
                  cost_table: pathlib.Path | None = None) -> list[str]:
    drill = ["--adaptive-inject-fault", str(inject_at)] if inject_at else []
    if cost_table is not None:
        drill += ["--adaptive-dspark-cost-table", str(cost_table)]
    if policy == "sweep":
        return ["--adaptive-policy", "sweep",
                "--adaptive-sweep", ",".join(map(str, sweep_pattern(kmax))), *drill]
    return ["--adaptive-policy", policy, *drill]


def _port() -> int:
    from .bench_ab import free_port

    return free_port()


def calibrate_budget(extra: Sequence[str], a: argparse.Namespace, out: pathlib.Path,
                     environ: dict[str, str]) -> pathlib.Path:
    """The budget policy's start-up cost table, measured by a server with the KV cache the
    user's arguments give (the soak's small cache cannot hold the calibration's batches);
    the soak's budget server then loads it."""
    table = out / "budget.cost-table.json"
    if table.exists():
        table.unlink()
    base = resolve_base(list(extra), environ)
    port = _port()
    argv, env = plugin_command(base, port, out / "budget-calibration.decisions.jsonl", environ,
                               ["--adaptive-policy", "budget",
                                "--adaptive-dspark-cost-table-output", str(table)])
    cmd = ServerCommand(BenchConfig("budget-calibration", "budget", base.kmax), argv, env, None)
    with Server(cmd, port, out / "budget-calibration.server.log") as server:
        server.start(a.startup_timeout)
    return table


def run_policy(base: Any, policy: str, jobs: list[Job], refs: dict[int, Reference],
               a: argparse.Namespace, out: pathlib.Path, environ: dict[str, str],
               seed: int, cost_table: pathlib.Path | None = None) -> dict[str, Any]:
    port = _port()
    trace = out / f"{policy}.decisions.jsonl"
    argv, env = plugin_command(base, port, trace, environ,
                               _policy_flags(policy, base.kmax, a.inject_fault_at, cost_table))
    cmd = ServerCommand(BenchConfig(policy, policy, base.kmax), argv, env, trace)
    with Server(cmd, port, out / f"{policy}.server.log") as server:
        server.start(a.startup_timeout)
        url = server.base_url + "/v1/completions"
        t0 = time.monotonic()
        with RssSampler(server, warm_s=WARM_SHARE * a.duration) as rss:
            outcomes = asyncio.run(_traffic(url, str(server.model_name), jobs, a, seed,
                                            on_warm=rss.mark_warm))
            seconds = time.monotonic() - t0
            metrics = _at_rest(server.base_url)
        alive = server.alive()
    summary = compare(outcomes, refs)
    summary.update({
        "policy": policy, "seconds": round(seconds, 1), "server_alive_at_end": alive,
        "preemptions": int(metrics.get("vllm:num_preemptions_total", 0)),
        "running_at_end": int(metrics.get("vllm:num_requests_running", 0)),
        "waiting_at_end": int(metrics.get("vllm:num_requests_waiting", 0)),
        "fallbacks": int(metrics.get("vllm_hust_vspec:runtime_fallbacks_total", 0)),
        "faults_injected": 1 if a.inject_fault_at else 0,
        "k_hist": _k_hist(trace), "rss_warm": rss.warm, "rss_end": rss.end,
        "rss_samples": [[round(t, 1), r] for t, r in rss.samples],
    })
    summary["checks"] = _checks(summary, a.rss_tolerance)
    return summary


def _k_hist(trace: pathlib.Path) -> dict[str, int]:
    from vllm_hust_vspec.adaptive.trace import is_decision

    hist: dict[str, int] = {}
    try:
        for line in trace.read_text().splitlines():
            rec = json.loads(line)
            if is_decision(rec):
                hist[str(rec["k"])] = hist.get(str(rec["k"]), 0) + 1
    except OSError:
        pass
    return dict(sorted(hist.items()))


def _checks(s: dict[str, Any], tolerance: float) -> dict[str, bool]:
    warm, end = s["rss_warm"], s["rss_end"]
    core = warm.get(ENGINE_CORE)
    steady = core is not None and end.get(ENGINE_CORE, 0) <= core * (1 + tolerance)
    return {
        "no mismatch": s["mismatches"] == 0,
        "none lost": s["lost"] == 0,
        "none answered twice": s["duplicated"] == 0,
        "requests completed": s["completed"] > 0,
        "some cancelled": s["cancelled"] > 0 or s["requests"] < 10,
        "preempted": s["preemptions"] > 0,
        "idle at end": s["running_at_end"] == 0 and s["waiting_at_end"] == 0,
        "server alive": bool(s["server_alive_at_end"]),
        "faults survived": s["fallbacks"] == s["faults_injected"],
        "rss steady": steady,
    }


def _table(results: list[dict[str, Any]]) -> str:
    head = ("policy", "requests", "completed", "cancelled", "lost", "dup", "mismatches",
            "near-ties", "preempted", "faults injected/fallbacks", "RSS after warm-up -> end (MB)", "checks")
    rows = [" | ".join(head), " | ".join("---" for _ in head)]
    for s in results:
        mb = " ".join(f"{name.split('::')[-1]} {rss / 2**20:.0f}->"
                      f"{s['rss_end'].get(name, 0) / 2**20:.0f}"
                      for name, rss in s["rss_warm"].items()) or "n/a"
        failed = [k for k, ok in s["checks"].items() if not ok]
        rows.append(" | ".join(str(x) for x in (
            s["policy"], s["requests"], s["completed"], s["cancelled"], s["lost"],
            s["duplicated"], s["mismatches"], len(s["near_ties"]), s["preemptions"],
            f"{s['faults_injected']}/{s['fallbacks']}", mb, "ok" if not failed else "FAILED: " + ", ".join(failed))))
    return "\n".join(rows)


def run_soak(a: argparse.Namespace, extra: Sequence[str]) -> int:
    import os

    from .bench_ab import default_prompts_dir
    from .quiet import load_1m

    policies = _policies(a.policies)
    _check_args(a)
    prompts = _prompts(pathlib.Path(a.prompts_dir) if a.prompts_dir else default_prompts_dir())
    environ = dict(os.environ)
    base = resolve_base(_launcher_args(extra, a.kv_blocks), environ)
    jobs = build_pool(prompts, a.pool, a.seed)
    out = pathlib.Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    load_start = load_1m()
    port = _port()
    ref_cmd = server_command(base, BenchConfig("none", "none", 0), port, None, environ)
    print(f"soak: reference (target only) for {len(jobs)} distinct requests", flush=True)
    with Server(ref_cmd, port, out / "reference.server.log") as server:
        server.start(a.startup_timeout)
        refs = _references(server.base_url + "/v1/completions", str(server.model_name),
                           jobs, a.clients)
    results = []
    for i, policy in enumerate(policies):
        table = None
        if policy == "budget":
            print("soak: budget: its start-up cost table, measured with the arguments' own "
                  "KV cache", flush=True)
            table = calibrate_budget(extra, a, out, environ)
        print(f"soak: {policy}: {a.clients} clients for {a.duration:.0f} s", flush=True)
        results.append(run_policy(base, policy, jobs, refs, a, out, environ, a.seed + i,
                                  table))
        doc = {"load_1m_start": load_start, "load_1m_end": load_1m(),
               "args": {k: v for k, v in vars(a).items() if k != "command"},
               "launcher_args": list(base.launcher_args), "results": results}
        write_atomic(out / "soak.json", json.dumps(doc, indent=2) + "\n")  # after each
    print(_table(results))
    for s in results:  # why a request counts as lost or mismatched, the first few
        for example in s["examples"][:5]:
            print(f"soak: {s['policy']}: {json.dumps(example)}")
    print(f"soak: {out / 'soak.json'}")
    ok = all(all(s["checks"].values()) for s in results)
    if not ok:
        print("soak: FAILED", file=sys.stderr)
    return 0 if ok else 1
