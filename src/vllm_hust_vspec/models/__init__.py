"""Out-of-tree models the plugin registers with vLLM where the host lacks them
(:mod:`.registration`; the models themselves import vLLM, the registration imports them
lazily by name)."""
