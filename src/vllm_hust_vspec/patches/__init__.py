"""Declarative host patches (one module per patch) and the registry that applies them."""
