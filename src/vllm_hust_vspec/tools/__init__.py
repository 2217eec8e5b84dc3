"""Command-line tools: doctor and manifest check."""
