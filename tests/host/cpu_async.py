"""Asynchronous scheduling on the CPU host, for the tests that need it.

vLLM's CPU platform forces ``scheduler_config.async_scheduling`` off
(``CpuPlatform.check_and_update_config``: "async scheduling is not required on CPU"), and the
V1 runner's async path hands its outputs over through CUDA streams and events, which a CPU
build of torch cannot create (``torch.cuda.Event``: "Tried to instantiate dummy base class";
``torch.Event``: "cpu backend doesn't support events").  What cannot run here is therefore
imitated, and only that:

* the platform keeps the ``async_scheduling`` the engine was asked for;
* CUDA streams and events are no-op stand-ins, the way vLLM's own CPU runner replaces the ones
  it creates in ``__init__`` (``cpu_model_runner._torch_cuda_wrapper``).  On the CPU every
  kernel has finished when it returns, so a no-op record / wait / synchronize orders nothing
  that was not ordered already.

Everything else is the host's own: ``AsyncScheduler``, the engine core's batch queue (two
steps in flight), the runner's async input preparation, its placeholders and its
``AsyncGPUModelRunnerOutput``.  In-process engines only (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
the stand-ins live in this process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class _Event:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, *args: Any, **kwargs: Any) -> None:
        pass

    def query(self) -> bool:
        return True


class _Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import torch

        self.device = torch.device("cpu")

    def wait_stream(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_event(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else _Event()

    def synchronize(self) -> None:
        pass


_CURRENT = None


def _current_stream(*args: Any, **kwargs: Any) -> _Stream:
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = _Stream()
    return _CURRENT


@contextlib.contextmanager
def async_scheduling_on_cpu() -> Iterator[None]:
    """For the block: the CPU platform keeps ``async_scheduling=True`` when asked, and torch's
    CUDA streams and events are the no-op stand-ins above."""
    import torch
    from vllm.platforms.cpu import CpuPlatform

    host_check = CpuPlatform.__dict__["check_and_update_config"]

    def keep_async(cls: Any, vllm_config: Any) -> None:
        asked = vllm_config.scheduler_config.async_scheduling
        host_check.__func__(cls, vllm_config)
        if asked:
            vllm_config.scheduler_config.async_scheduling = True

    saved = {name: getattr(torch.cuda, name) for name in ("Event", "Stream", "current_stream", "stream")}
    saved_event = torch.Event
    try:
        CpuPlatform.check_and_update_config = classmethod(keep_async)
        torch.cuda.Event = _Event
        torch.cuda.Stream = _Stream
        torch.cuda.current_stream = _current_stream
        torch.cuda.stream = lambda *a, **kw: contextlib.nullcontext()
        torch.Event = _Event
        yield
    finally:
        CpuPlatform.check_and_update_config = host_check
        for name, value in saved.items():
            setattr(torch.cuda, name, value)
        torch.Event = saved_event
