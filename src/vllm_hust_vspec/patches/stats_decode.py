"""Patch ``MPClient.__init__``: the front end decodes the plugin's field of the scheduler stats.

What:   wraps ``vllm.v1.engine.core_client.MPClient.__init__``; after the host's body, the
        client's output decoder decodes ``EngineCoreOutputs`` as
        :class:`vllm_hust_vspec.runtime.stats_channel.VspecEngineCoreOutputs`, whose
        ``scheduler_stats`` declares the ``vspec`` field the engine core's stats carry
        (:func:`~vllm_hust_vspec.runtime.stats_channel.decode_with_payload`; the decoder's
        hooks are kept).
Why:    the controller decides in the engine core; the API server's ``/metrics`` lives in the
        front end.  The host's per-step ``SchedulerStats`` is the one channel between them,
        and msgspec drops every attribute its type does not declare.
Remove: when ``SchedulerStats`` carries a field for plugins (or vLLM offers a plugin metrics
        channel from the engine core).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_hust_vspec.patchspec import PROCESS_FRONTEND, PatchSpec, Symbol

_CLIENT = "vllm.v1.engine.core_client"
_SERIAL = "vllm.v1.serial_utils"

SPEC = PatchSpec(
    name="stats-decode",
    target=Symbol(_CLIENT, "MPClient.__init__"),
    requires=(
        Symbol(_CLIENT, "MPClient.decoder"),
        Symbol(_SERIAL, "MsgpackDecoder.decoder"),
        Symbol(_SERIAL, "MsgpackDecoder.ext_hook"),
        Symbol(_SERIAL, "MsgpackDecoder.dec_hook"),
        Symbol("vllm.v1.engine", "EngineCoreOutputs.scheduler_stats"),
        Symbol("vllm.v1.metrics.stats", "SchedulerStats"),
    ),
    process=PROCESS_FRONTEND,
    why="decode the controller's metrics that ride on the engine core's scheduler stats",
    remove_when="SchedulerStats carries a field for plugins",
)


def make(original: Any) -> Any:
    from vllm_hust_vspec.runtime.stats_channel import decode_with_payload

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        decode_with_payload(self.decoder)

    return __init__
