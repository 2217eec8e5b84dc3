"""The ``vllm-hust-vspec`` launcher: presets, protocols, TOML and flags -> (argv, env) ->
run the vLLM server (supervised).  Works where vLLM is not importable (dry runs, CI of the CLI)."""
