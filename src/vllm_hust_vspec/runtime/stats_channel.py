"""The controller's metrics on the host's own per-step stats, engine core to API server.

vLLM sends one ``SchedulerStats`` per engine step from the engine core to the front end's
stat loggers (inside ``EngineCoreOutputs``, msgpack-encoded).  Its fields are fixed and
msgspec carries declared fields only, so the plugin declares one more in a subclass:
:class:`VspecSchedulerStats` adds ``vspec`` (the payload of
:meth:`~vllm_hust_vspec.runtime.metrics_feed.MetricsFeed.drain`).  The engine core sends its
stats as that subclass (:func:`with_payload`, called by the ``step-output`` patch); the front
end decodes ``EngineCoreOutputs`` as :class:`VspecEngineCoreOutputs`, whose
``scheduler_stats`` is the subclass (:func:`decode_with_payload`, the ``stats-decode`` patch).
Both sides of the wire stay the host's: a front end without the patch decodes the same bytes
as plain ``SchedulerStats`` (the extra key is dropped), and an engine without the plugin
sends no ``vspec`` key (the field's default, None, is decoded).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.metrics.stats import SchedulerStats

_FIELDS = tuple(f.name for f in dataclasses.fields(SchedulerStats))


@dataclasses.dataclass
class VspecSchedulerStats(SchedulerStats):
    """The host's scheduler stats plus the plugin's per-step controller metrics."""

    vspec: dict[str, Any] | None = None


class VspecEngineCoreOutputs(EngineCoreOutputs):  # type: ignore[misc]
    """The host's engine-core outputs, decoded with :class:`VspecSchedulerStats`."""

    scheduler_stats: VspecSchedulerStats | None = None


def with_payload(outputs: dict[int, Any], payload: dict[str, Any] | None) -> None:
    """Put ``payload`` on the scheduler stats of this step's ``outputs`` (the dict
    ``update_from_output`` returns: client index -> ``EngineCoreOutputs``); a step without
    stats (log stats off) carries nothing, and the payload is not kept."""
    if payload is None:
        return
    for eco in outputs.values():
        stats = eco.scheduler_stats
        if stats is None:
            continue
        if not isinstance(stats, VspecSchedulerStats):
            stats = VspecSchedulerStats(**{name: getattr(stats, name) for name in _FIELDS})
            eco.scheduler_stats = stats
        stats.vspec = payload
        return


def decode_with_payload(decoder: Any) -> None:
    """Make the client's ``MsgpackDecoder`` decode ``EngineCoreOutputs`` as
    :class:`VspecEngineCoreOutputs`, keeping its hooks."""
    decoder.decoder = msgspec.msgpack.Decoder(VspecEngineCoreOutputs, ext_hook=decoder.ext_hook,
                                              dec_hook=decoder.dec_hook)
