"""The configurations an A/B benchmark compares, and vLLM's batch-size table.

Configuration names on the command line (``--configs``):

* ``none``          target only (no speculation), plugin off;
* ``fixed``         one configuration per K of ``--fixed-ks``; ``fixed:K`` names one K;
                    vLLM's own ``num_speculative_tokens = K``, plugin off;
* ``native_table``  vLLM's ``num_speculative_tokens_per_batch_size`` (the table of
                    ``--native-table``), Kmax = the launcher's ``--gamma``, plugin off;
* ``online``        the plugin on, ``--adaptive-policy online``, K <= Kmax;
* ``budget``        the plugin on, ``--adaptive-policy budget``;
* ``plugin:K``      the plugin on at a fixed K (``--adaptive-policy fixed
                    --adaptive-fixed-gamma K``, 0 <= K <= Kmax): ``plugin:0`` is the plugin's
                    K = 0 against ``none`` (what K = 0 costs);
* ``paired``        ONE plugin server in which fixed K = each of ``--fixed-ks`` and
                    ``online`` take turns in short windows (``--adaptive-compare``; the list
                    is ``--paired-policies``): paired ratios inside one engine
                    (:mod:`.bench_paired`).

Pure Python: no vLLM import.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence

from vllm_hust_vspec import checks
from vllm_hust_vspec.errors import VspecError
from vllm_hust_vspec.settings import SettingsError, parse_schedule

PLUGIN_POLICIES = ("online", "budget", "plugin_fixed", "paired")
CONFIG_NAMES = ("none", "fixed", "native_table", "online", "budget", "plugin", "paired")

NativeTable = list[list[int]]  # [[range_start, range_end, K], ...] (inclusive ranges)


class ConfigError(VspecError, ValueError):
    """A configuration list or a batch-size table is malformed."""


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    name: str  # as reported in results.json ("none", "fixed-k2", "native_table", "online")
    policy: str  # none | fixed | native_table | online | budget | plugin_fixed
    k: int  # K for fixed and plugin_fixed, Kmax for native_table/online/budget, 0 for none
    compare: tuple[str, ...] = ()  # paired: the policies that take turns ("fixed:2", "online")

    @property
    def plugin(self) -> bool:
        return self.policy in PLUGIN_POLICIES

    @property
    def uses_budget(self) -> bool:
        """The budget policy runs in this server (alone, or taking turns in ``paired``)."""
        return self.policy == "budget" or "budget" in self.compare


def parse_int_list(text: str, flag: str, minimum: int = 1) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = int(part)
        except ValueError:
            raise ConfigError(f"{flag}: {part!r} is not an integer") from None
        if v < minimum:
            raise ConfigError(f"{flag}: {v} must be >= {minimum}")
        out.append(v)
    if not out:
        raise ConfigError(f"{flag}: give at least one value")
    if len(set(out)) != len(out):
        raise ConfigError(f"{flag}: {text!r} repeats a value")
    return tuple(out)


def parse_configs(text: str, fixed_ks: Sequence[int], kmax: int) -> list[BenchConfig]:
    """``"none,fixed,native_table,online"`` -> the configurations, in that order."""
    out: list[BenchConfig] = []
    for raw in (p.strip() for p in text.split(",")):
        if not raw:
            continue
        if raw == "none":
            out.append(BenchConfig("none", "none", 0))
        elif raw == "fixed":
            out += [BenchConfig(f"fixed-k{k}", "fixed", k) for k in fixed_ks]
        elif raw.startswith("fixed:"):
            (k,) = parse_int_list(raw[len("fixed:"):], f"--configs {raw}")
            out.append(BenchConfig(f"fixed-k{k}", "fixed", k))
        elif raw.startswith("plugin:"):
            (k,) = parse_int_list(raw[len("plugin:"):], f"--configs {raw}", minimum=0)
            if k > kmax:
                raise ConfigError(f"--configs {raw}: K={k} exceeds Kmax={kmax} (--gamma)")
            out.append(BenchConfig(f"plugin-k{k}", "plugin_fixed", k))
        elif raw in ("native_table", "online", "budget"):
            out.append(BenchConfig(raw, raw, kmax))
        elif raw == "paired":
            out.append(BenchConfig("paired", "paired", kmax,
                                   paired_policies("fixed,online", fixed_ks, kmax)))
        else:
            raise ConfigError(f"--configs: unknown configuration {raw!r} (known: none, fixed, "
                              f"fixed:K, native_table, online, budget, plugin:K, paired)")
    if not out:
        raise ConfigError("--configs: give at least one configuration")
    names = [c.name for c in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"--configs: configuration {dup[0]!r} appears twice")
    return out


def paired_policies(text: str, fixed_ks: Sequence[int], kmax: int) -> tuple[str, ...]:
    """``--paired-policies``: ``fixed`` (fixed:K for each of ``fixed_ks``), ``fixed:K``,
    ``online``, ``budget``, comma-separated -> the ``--adaptive-compare`` list."""
    out: list[str] = []
    for raw in (p.strip() for p in text.split(",")):
        if not raw:
            continue
        if raw == "fixed":
            out += [f"fixed:{k}" for k in fixed_ks]
        elif raw.startswith("fixed:"):
            (k,) = parse_int_list(raw[len("fixed:"):], f"--paired-policies {raw}", minimum=0)
            if k > kmax:
                raise ConfigError(f"--paired-policies {raw}: K={k} exceeds Kmax={kmax} (--gamma)")
            out.append(f"fixed:{k}")
        elif raw in ("online", "budget"):
            out.append(raw)
        else:
            raise ConfigError(f"--paired-policies: unknown policy {raw!r} (known: fixed, "
                              f"fixed:K, online, budget)")
    if len(out) < 2 or len(set(out)) < len(out):
        raise ConfigError(f"--paired-policies: give two or more different policies, got "
                          f"{','.join(out) or 'none'}")
    return tuple(out)


def table_from_text(text: str, source: str) -> NativeTable:
    """``"1-4:4,5-16:2"`` (inclusive batch-size ranges, the schedule syntax of
    ``--adaptive-schedule``) -> vLLM's ``[[1, 4, 4], [5, 16, 2]]``."""
    return check_table(text, source)


def table_from_policy(policy: dict[int, int], source: str) -> NativeTable:
    """A ``batch_gamma_policy`` (batch -> K, "smallest key >= B, else the last") as vLLM's
    inclusive ranges: keys b1 < b2 < ... give ``[1, b1, K1], [b1+1, b2, K2], ...`` (vLLM carries
    the last K past the last range, matching "else the last")."""
    if not policy:
        raise ConfigError(f"{source}: batch_gamma_policy is empty")
    table: NativeTable = []
    lo = 1
    for b in sorted(policy):
        table.append([lo, b, int(policy[b])])
        lo = b + 1
    return check_table(table, source)


def check_table(table: str | NativeTable, source: str) -> NativeTable:
    """The rules of vLLM's ``validate_and_normalize_dynamic_sd_schedule`` (the one schedule
    parser, :func:`vllm_hust_vspec.settings.parse_schedule`), checked before any server
    starts: positive sorted non-overlapping ranges starting at 1, K >= 0."""
    try:
        return [list(entry) for entry in parse_schedule(table, source)]
    except SettingsError as exc:
        raise ConfigError(str(exc)) from None


def load_native_table(spec: str) -> NativeTable:
    """``--native-table``: a profile JSON with ``batch_gamma_policy`` (as written by
    ``vllm-hust-vspec-profile``) or an inline ``LO-HI:K,...`` table."""
    if spec.endswith(".json"):
        path = pathlib.Path(spec)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"--native-table {spec}: cannot read: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--native-table {spec}: invalid JSON at line {exc.lineno}: "
                              f"{exc.msg}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--native-table {spec}: {checks.not_utf8(exc)}") from None
        except checks.PARSER_LIMITS as exc:
            raise ConfigError(f"--native-table {spec}: invalid JSON: "
                              f"{checks.parser_limit(exc)}") from None
        policy = doc.get("batch_gamma_policy") if isinstance(doc, dict) else None
        if not isinstance(policy, dict):
            raise ConfigError(f"--native-table {spec}: key 'batch_gamma_policy' is missing "
                              "(write one with vllm-hust-vspec-profile)")
        parsed: dict[int, int] = {}
        for b, k in policy.items():
            batch = checks.decimal_key(b)
            if batch is None or not checks.is_int(k):
                raise ConfigError(f"--native-table {spec}: batch_gamma_policy must map batch "
                                  f"sizes to integers, got {b!r}: {k!r}")
            parsed[batch] = k
        return table_from_policy(parsed, f"--native-table {spec}")
    return table_from_text(spec, f"--native-table {spec!r}")


def table_text(table: NativeTable) -> str:
    return ",".join(f"{lo}-{hi}:{k}" for lo, hi, k in table)
