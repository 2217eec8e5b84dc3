"""Layer the inputs into effective options: schema default < protocol < TOML [serve] <
flags; then apply the cross-option rules and refuse contradictions, all before anything
starts."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from vllm_hust_vspec import retired, settings
from vllm_hust_vspec.launcher import model_store
from vllm_hust_vspec.launcher.errors import LaunchError
from vllm_hust_vspec.launcher.parser import parse_cli
from vllm_hust_vspec.launcher.platform import detect_platform
from vllm_hust_vspec.launcher.protocols import Protocol, get_protocol
from vllm_hust_vspec.launcher.toml_config import ConfigFile, load_config

DEFAULT = "default"
DEFAULT_GAMMA = 4
DEFAULT_GAMMA_MTP = 6
_CALIBRATION_OPTIONS = settings.CALIBRATION_OPTIONS  # grid, output, saved table


@dataclasses.dataclass(frozen=True)
class Resolved:
    values: settings.Settings  # every option, effective
    sources: dict[str, str]  # option name -> where its value came from
    config: ConfigFile | None
    protocol: Protocol | None
    platform: str
    platform_explicit: bool
    extra_args: tuple[str, ...]
    target: model_store.Lookup | None
    draft: model_store.Lookup | None
    # speculation settings of a preset or protocol that ``--method none`` set aside
    # (option name -> where it came from)
    set_aside: tuple[tuple[str, str], ...] = ()

    @property
    def speculative(self) -> bool:
        return self.values.method != "none"


def _source_label(opt: settings.Option, layer: str, value: Any) -> str:
    if layer == "flag":
        if opt.type == "bool" and opt.negatable and value is False:
            return "--no-" + opt.cli_flag[2:]
        return opt.cli_flag
    return f"{layer} {opt.name}"


def _config_path(explicit: Mapping[str, Any], environ: Mapping[str, str]) -> str | None:
    """``--config``, else ``VSPEC_CONFIG`` (legacy ``SPECSLO_CONFIG``, ``SPECASCEND_CONFIG``)."""
    if "config" in explicit:
        return str(explicit["config"])
    for name in settings.option("config").legacy_env:
        if environ.get(name):
            return environ[name]
    return None


def _set_by_user(sources: Mapping[str, str], name: str) -> bool:
    """True when a TOML file or flag set the option (not the default or a protocol)."""
    src = sources[name]
    return src != DEFAULT and not src.startswith("protocol ")


def resolve(argv: Sequence[str], environ: Mapping[str, str]) -> Resolved:
    explicit, cli_extra = parse_cli(argv)
    problem = retired.check_environment(environ)
    if problem is not None:
        raise LaunchError(problem)
    config_path = _config_path(explicit, environ)
    config = load_config(config_path) if config_path else None

    protocol = None
    if "protocol" in explicit:
        protocol = get_protocol(explicit["protocol"], "--protocol")
    elif config is not None and "protocol" in config.serve:
        protocol = get_protocol(config.serve["protocol"], f"{config.path}: [serve] protocol")

    merged, sources, extra = _merge_layers(protocol, config, explicit, cli_extra)

    method = settings.canonical_method(str(merged["method"]), sources["method"])
    merged["method"] = method

    if protocol is not None:
        _check_protocol(protocol, merged, sources)
        lossy = settings.lossy_rules(merged)
        if lossy:
            raise LaunchError(f"--protocol {protocol.name} compares results: lossy acceptance "
                              f"({', '.join(lossy)}) changes the output and is refused there")
    set_aside = _set_aside_for_none(merged, sources)
    _implied_policy(merged, sources)

    platform_explicit = merged["target_platform"] is not None
    platform = merged["target_platform"] or detect_platform()

    _check_conflicts(merged, sources, platform)

    if merged["gamma"] is None and method != "none":
        merged["gamma"] = DEFAULT_GAMMA_MTP if method == "mtp" else DEFAULT_GAMMA

    values = settings.Settings(merged)
    try:
        settings.validate(values, source="options")
        if method != "none":
            settings.check_kmax(values, merged["gamma"], source="options")
            _check_calibration_files(values, sources)
    except settings.SettingsError as exc:
        raise LaunchError(str(exc)) from None

    target, draft = _models(method, explicit, merged, sources, environ)
    return Resolved(values=values, sources=sources, config=config, protocol=protocol,
                    platform=platform, platform_explicit=platform_explicit,
                    extra_args=tuple(extra), target=target, draft=draft, set_aside=set_aside)


def _merge_layers(
    protocol: Any, config: Any, explicit: Mapping[str, Any], cli_extra: Sequence[str]
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Defaults < protocol < config file [serve] < flags: the merged values, where each
    came from, and the native vLLM arguments (``extra_args`` accumulate, CLI ones last)."""
    merged: dict[str, Any] = {o.name: o.default for o in settings.OPTIONS}
    sources: dict[str, str] = {o.name: DEFAULT for o in settings.OPTIONS}
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if protocol is not None:
        layers.append((f"protocol {protocol.name}:", protocol.settings))
    if config is not None:
        layers.append((f"{config.path}: [serve]", config.serve))
    layers.append(("flag", explicit))
    extra: list[str] = []
    for layer, values in layers:
        for name, value in values.items():
            opt = settings.option(name)
            if name == "extra_args":
                extra.extend(value)
            else:
                merged[name] = value
            sources[name] = _source_label(opt, layer, value)
    extra.extend(cli_extra)
    return merged, sources, extra


def _implied_policy(merged: dict[str, Any], sources: dict[str, str]) -> None:
    """A profile implies the profile policy, a calibration option the budget policy, when
    no policy was given."""
    if merged["adaptive_profile"] and sources["adaptive_policy"] == DEFAULT:
        merged["adaptive_policy"] = "profile"
        sources["adaptive_policy"] = f"implied by {sources['adaptive_profile']}"
    for name in _CALIBRATION_OPTIONS:
        if merged[name] and sources["adaptive_policy"] == DEFAULT:
            merged["adaptive_policy"] = "budget"
            sources["adaptive_policy"] = f"implied by {sources[name]}"


def _check_calibration_files(values: settings.Settings, sources: Mapping[str, str]) -> None:
    """The start-up calibration's files, before anything runs: the calibration grid's
    format, fields, ranges and width (= --gamma), the cost table's format, fields and width,
    and that the cost-table output is a new file in an existing directory.  The engine
    repeats them with what only it knows (KV capacity, captured graphs, model identity)."""
    if "budget" not in settings.policies_in_use(values):
        return  # any calibration option with another policy was refused as a conflict
    from vllm_hust_vspec.startup_cost import calibration_settings  # numpy: only when used

    calibration_settings(values, draft_width=values.gamma, max_model_len=values.max_model_len,
                         max_num_seqs=values.max_num_seqs, sources=sources)


def _check_protocol(protocol: Protocol, merged: dict[str, Any], sources: dict[str, str]) -> None:
    method = merged["method"]
    if method not in protocol.methods:
        raise LaunchError(
            f"protocol {protocol.name} was validated with method "
            f"{' or '.join(protocol.methods)}; got {method!r} from {sources['method']} "
            f"(run without --protocol to use another method)"
        )
    for name in protocol.pinned:
        want = protocol.settings[name]
        have = merged[name]
        if name == "method":
            want = settings.canonical_method(str(want))
        if have != want:
            opt = settings.option(name)
            raise LaunchError(
                f"protocol {protocol.name} pins {name} = {_show(opt, want)}; got "
                f"{_show(opt, have)} from {sources[name]} (drop it, or run without "
                f"--protocol to leave the validated contract)"
            )
    for name, value in protocol.per_method.get(method, {}).items():
        if sources[name] == DEFAULT:
            merged[name] = value
            sources[name] = f"protocol {protocol.name}: {name} for {method}"


def _show(opt: settings.Option, value: Any) -> str:
    if value is None:
        return "unset"
    if opt.type == "bool":
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def _speculation_only() -> list[str]:
    """The options that mean nothing without speculation."""
    return (["draft_model", "gamma", "prompt_lookup_min", "prompt_lookup_max",
             "draft_tensor_parallel_size", "mtp_local_argmax_reduction",
             "eagle_disable_draft_torch_compile"]
            + [o.name for o in settings.options("plugin")])


def _set_aside_for_none(merged: dict[str, Any], sources: dict[str, str]
                        ) -> tuple[tuple[str, str], ...]:
    """``--method none`` on the command line over a speculative preset (TOML or protocol):
    the preset's speculation settings go back to their defaults, so its target runs without
    speculation.  Returns what was set aside; options given as flags are kept (and conflict
    with method none in :func:`_check_conflicts`)."""
    if merged["method"] != "none" or not sources["method"].startswith("--"):
        return ()
    out = []
    for name in _speculation_only():
        src = sources[name]
        if src == DEFAULT or src.startswith("--"):
            continue
        out.append((name, src))
        merged[name] = settings.option(name).default
        sources[name] = DEFAULT
    return tuple(out)


def _conflict(a: str, b: str, why: str) -> LaunchError:
    return LaunchError(f"conflicting options: {a} and {b}: {why}")


def _check_conflicts(merged: Mapping[str, Any], sources: Mapping[str, str], platform: str) -> None:
    method = merged["method"]
    if merged["json"] and not merged["dry_run"]:
        raise _conflict("--json", "a real start", "--json only formats --dry-run output")
    if method == "none":
        for name in _speculation_only():
            if _set_by_user(sources, name):
                raise _conflict(sources["method"] + " none", sources[name],
                                "method none runs without speculation, so it takes no "
                                "speculation or controller option")
    elif method not in settings.METHODS_WITH_DRAFT_MODEL and merged["draft_model"]:
        raise LaunchError(
            f"method {method} takes no draft model (its drafter is "
            f"{'the target checkpoint' if method == 'mtp' else 'the prompt'}); "
            f"remove draft_model (from {sources['draft_model']})"
        )
    for name in ("prompt_lookup_min", "prompt_lookup_max"):
        if merged[name] is not None and method != "ngram":
            raise _conflict(sources[name], f"method {method}",
                            "prompt lookup applies to method ngram only")
    lo, hi = merged["prompt_lookup_min"], merged["prompt_lookup_max"]
    if lo is not None and hi is not None and lo > hi:
        raise _conflict(sources["prompt_lookup_min"], sources["prompt_lookup_max"],
                        f"prompt_lookup_min={lo} exceeds prompt_lookup_max={hi}")
    if not merged["adaptive_speculation"]:
        for name in ("adaptive_policy", "adaptive_profile", "adaptive_stop",
                     *_CALIBRATION_OPTIONS):
            if _set_by_user(sources, name) and _set_by_user(sources, "adaptive_speculation"):
                raise _conflict(sources["adaptive_speculation"], sources[name],
                                "the controller is off, so it has no policy to choose")
    for name in _CALIBRATION_OPTIONS:
        if merged[name] and "budget" not in settings.policies_in_use(merged):
            raise _conflict(sources[name], sources["adaptive_policy"],
                            f"{name} is read by the budget policy only, not "
                            f"{merged['adaptive_policy']!r}")
    if merged["adaptive_dspark_cost_table"]:
        for name in _CALIBRATION_OPTIONS[:2]:
            if merged[name]:
                raise _conflict(sources["adaptive_dspark_cost_table"], sources[name],
                                "a saved cost table skips the start-up calibration")
    if merged["adaptive_profile"] and "profile" not in settings.policies_in_use(merged):
        raise _conflict(sources["adaptive_profile"], sources["adaptive_policy"],
                        f"adaptive_profile is read by the profile policy only, not "
                        f"{merged['adaptive_policy']!r}")
    for methods, names in (
            (("draft_model",), ("draft_active_vocab_ids", "draft_lm_head_quantization")),
            (("eagle", "eagle3"), ("eagle_draft_active_vocab_ids",
                                   "eagle_draft_lm_head_quantization"))):
        for name in names:
            if _set_by_user(sources, name) and method not in methods:
                raise _conflict(sources[name], f"method {method}",
                                f"{name} is for the {' / '.join(methods)} drafter's LM head")
    if merged["eagle_relaxed_accept_topk"] > 1 and method not in ("eagle", "eagle3"):
        raise _conflict(sources["eagle_relaxed_accept_topk"], f"method {method}",
                        "relaxed top-K acceptance is for EAGLE / EAGLE-3 drafts "
                        "(--confidence-accept-margin works for every drafter)")
    if merged["mtp_local_argmax_reduction"] is not None and method != "mtp":
        raise _conflict(sources["mtp_local_argmax_reduction"], f"method {method}",
                        "the local argmax reduction is the MTP drafter's")
    if merged["eagle_disable_draft_torch_compile"] is not None and method == "ngram":
        raise _conflict(sources["eagle_disable_draft_torch_compile"], "method ngram",
                        "the n-gram drafter runs no model")
    for name in ("capture_policy", "capture_sizes"):
        if merged["graph_mode"] == "eager" and _set_by_user(sources, name):
            raise _conflict(sources["graph_mode"] + " eager", sources[name],
                            "eager mode captures no graphs")
    if merged["device"] is not None and platform == "cpu":
        raise _conflict(sources["device"], "platform cpu",
                        "--device selects accelerators (CUDA/NPU); the CPU host has none")


def _models(
    method: str,
    explicit: Mapping[str, Any],
    merged: Mapping[str, Any],
    sources: Mapping[str, str],
    environ: Mapping[str, str],
) -> tuple[model_store.Lookup | None, model_store.Lookup | None]:
    model_dir = merged["model_dir"] or environ.get(model_store.MODEL_DIR_ENV) or None
    registry = merged["model_registry"] or environ.get(model_store.REGISTRY_ENV) or None
    store = model_store.ModelStore(model_dir, registry)
    lookups = []
    roles = ["target"] + (["draft"] if method in settings.METHODS_WITH_DRAFT_MODEL else [])
    for role in roles:
        value, source = model_store.pick_value(role, method, explicit, merged, sources, environ)
        if value is None:
            flag = "--target-model" if role == "target" else "--draft-model"
            envs = " or ".join(model_store.env_names(role, method))
            what = "a target model" if role == "target" else "a draft model"
            raise LaunchError(f"method {method} needs {what}: pass {flag} PATH (or set {envs})")
        path, tried = store.resolve(value)
        lookups.append(model_store.Lookup(role, value, source, path, tried))
    target = lookups[0]
    draft = lookups[1] if len(lookups) > 1 else None
    return target, draft
