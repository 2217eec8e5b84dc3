"""vllm-hust-vspec: adaptive speculative decoding for vLLM (a vllm.general_plugins plugin)."""

from vllm_hust_vspec._version import __version__

__all__ = ["__version__"]
