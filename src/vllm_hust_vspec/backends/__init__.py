"""Per-speculative-method knowledge (what each host method can do under a varying K)."""
