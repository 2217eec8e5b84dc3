"""Effective options -> the exact server command and the environment it needs."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from collections.abc import Mapping
from typing import Any

from vllm_hust_vspec import settings
from vllm_hust_vspec.capture import capture_sizes
from vllm_hust_vspec.launcher.errors import LaunchError
from vllm_hust_vspec.launcher.platform import graph_capable, vllm_console_works
from vllm_hust_vspec.launcher.resolve import Resolved

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
PLUGIN_NAME = "vspec"  # our vllm.general_plugins entry-point name
CPU_KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
CPU_KVCACHE_DEFAULT_GIB = "1"
# max_num_seqs assumed for capture sizes when the user leaves it to vLLM.
CAPTURE_DEFAULT_MAX_NUM_SEQS = 256
GRAPH_MODES = {
    "piecewise": "PIECEWISE",
    "full-decode-only": "FULL_DECODE_ONLY",
    "full-and-piecewise": "FULL_AND_PIECEWISE",
    "full": "FULL",
}
DEVICE_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}
# vLLM flags the launcher owns whenever it writes them.
_ALIASES = {"--compilation-config": ("-cc", "-O"), "--model": ()}


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    executable: str  # what is run (absolute when found)
    argv: list[str]  # argv[0] symbolic: "vllm" or "python"
    env: dict[str, str]  # every variable set or changed
    unset: tuple[str, ...]  # inherited variables removed (stale plugin settings)

    def as_json(self) -> str:
        return json.dumps({"executable": self.executable, "argv": self.argv, "env": self.env},
                          indent=2)


# launcher options that become a speculative-config key when set: (option, key)
SPECULATIVE_CONFIG_KEYS = (
    ("prompt_lookup_min", "prompt_lookup_min"),
    ("prompt_lookup_max", "prompt_lookup_max"),
    ("draft_tensor_parallel_size", "draft_tensor_parallel_size"),
    ("mtp_local_argmax_reduction", "use_local_argmax_reduction"),
    ("eagle_disable_draft_torch_compile", "enforce_eager"),
)


def speculative_config(res: Resolved) -> dict[str, Any] | None:
    v = res.values
    if v.method == "none":
        return None
    cfg: dict[str, Any] = {"method": v.method}
    if res.draft is not None:
        cfg["model"] = res.draft.path
    cfg["num_speculative_tokens"] = v.gamma
    for name, key in SPECULATIVE_CONFIG_KEYS:
        if v[name] is not None:
            cfg[key] = v[name]
    return cfg


def compilation_config(res: Resolved) -> dict[str, Any] | None:
    v = res.values
    cfg: dict[str, Any] = {}
    if v.graph_mode in GRAPH_MODES:
        cfg["cudagraph_mode"] = GRAPH_MODES[v.graph_mode]
    graphs = graph_capable(res.platform) and v.graph_mode != "eager"
    if graphs and v.capture_sizes:
        cfg["cudagraph_capture_sizes"] = sorted(set(v.capture_sizes))
    elif graphs and v.method != "none":
        cfg["cudagraph_capture_sizes"] = capture_sizes(
            max_num_seqs=v.max_num_seqs or CAPTURE_DEFAULT_MAX_NUM_SEQS,
            kmax=v.gamma,
            policy=v.capture_policy,
            kmin=v.adaptive_min_gamma if v.adaptive_speculation else v.gamma,
            adaptive=bool(v.adaptive_speculation),
            max_num_batched_tokens=v.max_num_batched_tokens,
        )
    return cfg or None


def host_args(values: settings.Settings) -> list[str]:
    """vLLM arguments of the host-scope options that are set, in schema order."""
    out: list[str] = []
    for opt in settings.options("host"):
        value = values[opt.name]
        if value is None:
            continue
        assert opt.vllm_flag is not None
        if opt.type == "bool":
            if value:
                out.append(opt.vllm_flag)
            elif opt.negatable_host:
                out.append("--no-" + opt.vllm_flag[2:])
        elif opt.type == "float":
            out += [opt.vllm_flag, f"{value:g}"]
        else:
            out += [opt.vllm_flag, str(value)]
    return out


def uses_python_module(res: Resolved) -> bool:
    """CPU hosts (and hosts whose ``vllm`` console script cannot start) get
    ``python -m vllm.entrypoints.openai.api_server``."""
    if res.platform == "cpu":
        return True
    return not res.platform_explicit and not vllm_console_works()


def build_argv(res: Resolved) -> list[str]:
    assert res.target is not None
    if uses_python_module(res):
        argv = ["python", "-m", API_SERVER_MODULE, "--model", res.target.path]
    else:
        argv = ["vllm", "serve", res.target.path]
    argv += host_args(res.values)
    if res.values.graph_mode == "eager":
        argv.append("--enforce-eager")
    cc = compilation_config(res)
    if cc is not None:
        argv += ["--compilation-config", json.dumps(cc, separators=(",", ":"))]
    sc = speculative_config(res)
    if sc is not None:
        argv += ["--speculative-config", json.dumps(sc, separators=(",", ":"))]
    _check_extra(argv, res.extra_args)
    return argv + list(res.extra_args)


def _flag_names(arg: str) -> set[str]:
    """The names an argument sets: ``--x``/``--no-x`` both mean option ``x``."""
    if not arg.startswith("-"):
        return set()
    name = arg.split("=", 1)[0]
    names = {name}
    if name.startswith("--no-"):
        names.add("--" + name[5:])
    for main, aliases in _ALIASES.items():
        if name in aliases:
            names.add(main)
    return names


def _check_extra(argv: list[str], extra: tuple[str, ...]) -> None:
    ours: set[str] = {"--model", "--speculative-config"}
    for a in argv:
        ours |= _flag_names(a)
    for a in extra:
        clash = _flag_names(a) & ours
        if clash:
            raise LaunchError(
                f"conflicting options: native vLLM argument {a!r} (after --) and the "
                f"launcher's own {sorted(clash)[0]}: set it with the launcher's flag or "
                f"TOML key instead"
            )


def build_env(res: Resolved, environ: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    env: dict[str, str] = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    if res.platform == "cpu" and CPU_KVCACHE_ENV not in environ:
        env[CPU_KVCACHE_ENV] = CPU_KVCACHE_DEFAULT_GIB
    unset: list[str] = []
    if res.speculative:
        env[settings.ENABLE_ENV] = "1"
        ours = res.values.to_env()
        env.update(ours)
        for name in sorted(set(settings.iter_env_names())):
            if name in environ and name not in ours:
                unset.append(name)
        plugins = environ.get("VLLM_PLUGINS")
        if plugins is not None and PLUGIN_NAME not in plugins.split(","):
            env["VLLM_PLUGINS"] = ",".join(p for p in (plugins, PLUGIN_NAME) if p)
    else:
        env[settings.ENABLE_ENV] = "0"
    if res.values.device is not None:
        env[DEVICE_ENV[res.platform]] = res.values.device
    if res.config is not None:
        env.update(res.config.env)
    return env, tuple(unset)


def build_plan(res: Resolved, environ: Mapping[str, str]) -> LaunchPlan:
    argv = build_argv(res)
    env, unset = build_env(res, environ)
    if argv[0] == "python":
        executable = sys.executable
    else:
        executable = shutil.which("vllm", path=environ.get("PATH")) or "vllm"
    return LaunchPlan(executable=executable, argv=argv, env=env, unset=unset)
