"""The only place the package version is written."""

__version__ = "0.15.0.dev0"
