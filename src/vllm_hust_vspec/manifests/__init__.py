"""Static Extension Manager manifest of vllm-hust-vspec (data only).

The vLLM-HUST Extension Manager discovers this directory through the entry point
``vllm_hust.extension_bundles: org.vllm-hust.vspec = vllm_hust_vspec.manifests`` and reads
``vllm-hust-extension-v0.3.json`` without importing anything.  This module must import
nothing; the validator lives in :mod:`vllm_hust_vspec.tools.manifest_check`.
"""
