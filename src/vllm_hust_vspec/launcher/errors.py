"""The launcher's one error type: a message meant for the user, printed once."""

from __future__ import annotations

from vllm_hust_vspec.settings import SettingsError


class LaunchError(SettingsError):
    """Bad input caught before anything starts (the message names file/key/flag)."""
