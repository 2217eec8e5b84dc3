"""The ``vllm-hust-vspec`` launcher: presets, protocols, TOML and flags -> (argv, env) ->
exec the vLLM server.  Works where vLLM is not importable (dry runs, CI of the CLI)."""
