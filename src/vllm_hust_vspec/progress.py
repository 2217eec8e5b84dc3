"""Progress of long work: a tqdm bar (rate, ETA) on a terminal, plain periodic lines otherwise.

Used by the fixture builder, the start-up calibration, the profile tool and ``bench ab``.
On a terminal the bar redraws in place; when the stream is a file or a pipe (CI, a log),
a line ``[desc] 120/650 (18%) 2.6 step/s, ETA 3m24s, loss 5.41`` is written at most every
``every_s`` seconds and once at the end, so logs stay short and still say how far it got.
``VSPEC_PROGRESS=lines`` forces the lines on a terminal, ``VSPEC_PROGRESS=bar`` the bar
elsewhere. A caller that already logs a line per unit of work (``lines=False``) gets the bar
on a terminal and nothing more elsewhere. Leaf module: imports nothing of this package.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import IO, Any

MODES = ("auto", "bar", "lines")


def _mode(stream: IO[str]) -> str:
    mode = os.environ.get("VSPEC_PROGRESS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"VSPEC_PROGRESS must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "auto":
        isatty = getattr(stream, "isatty", None)
        return "bar" if isatty is not None and isatty() else "lines"
    return mode


def format_seconds(s: float) -> str:
    """``75`` -> ``1m15s``; ``3725`` -> ``1h02m05s``; unknown -> ``?``."""
    if not math.isfinite(s) or s < 0:
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


class Progress:
    """``with Progress(650, "target") as p: ... p.update(loss=x)``.

    ``clock`` is injectable for tests (seconds, monotonic)."""

    def __init__(self, total: int, desc: str, *, unit: str = "step", stream: IO[str] | None = None,
                 every_s: float = 30.0, lines: bool = True, clock=time.monotonic) -> None:
        if total < 0:
            raise ValueError(f"progress total must be >= 0, got {total}")
        self.total, self.desc, self.unit = int(total), desc, unit
        self.stream = sys.stderr if stream is None else stream
        self.every_s, self.clock = every_s, clock
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self.mode = _mode(self.stream)
        if self.mode == "lines" and not lines:
            self.mode = "quiet"
        self._t0 = self._last = clock()
        self._bar = None
        if self.mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True,
                             leave=True, mininterval=0.5)

    # rate and ETA from the counts so far
    @property
    def elapsed_s(self) -> float:
        return self.clock() - self._t0

    @property
    def rate(self) -> float:
        el = self.elapsed_s
        return self.n / el if el > 0 else float("nan")

    @property
    def eta_s(self) -> float:
        r = self.rate
        return (self.total - self.n) / r if r and r > 0 and math.isfinite(r) else float("nan")

    def line(self) -> str:
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        extra = "".join(f", {k} {_fmt(v)}" for k, v in self.postfix.items())
        return (f"[{self.desc}] {self.n}/{self.total}{pct} {_fmt(self.rate)} {self.unit}/s, "
                f"elapsed {format_seconds(self.elapsed_s)}, ETA {format_seconds(self.eta_s)}{extra}")

    def update(self, n: int = 1, **postfix: Any) -> None:
        self.n += n
        if postfix:
            self.postfix.update(postfix)
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix({k: _fmt(v) for k, v in self.postfix.items()}, refresh=False)
            self._bar.update(n)
            return
        if self.mode == "quiet":
            return
        now = self.clock()
        if now - self._last >= self.every_s or (self.n == self.total and self.n):
            self._last = now
            self.write(self.line())

    def write(self, msg: str, file: IO[str] | None = None) -> None:
        """A message (to ``file``, default the progress stream) that does not break the bar."""
        out = self.stream if file is None else file
        if self._bar is not None:
            self._bar.write(msg, file=out)
            out.flush()
        else:
            print(msg, file=out, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.mode == "lines" and self.n != self.total:  # ended early: say where it stopped
            self.write(self.line())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
