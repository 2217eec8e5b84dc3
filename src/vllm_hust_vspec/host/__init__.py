"""Knowledge of host versions and processes (no vLLM import at module load)."""
