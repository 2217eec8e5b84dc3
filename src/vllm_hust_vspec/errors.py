"""The one error base of vllm-hust-vspec.

Every error the project raises for bad input derives from :class:`VspecError`, which
carries ``(source, field, message)``:

* ``source``: where the bad value came from -- a file, a flag, an env var, or None;
* ``field``: the key, field or symbol inside it, or None;
* ``message``: what is wrong.

``str()`` is one line naming the source and the field: ``"<source>: <field>: <message>"``
(parts that are None are left out; a line break inside ``source`` or ``field`` -- a key or
file name as the user wrote it -- is shown escaped, :func:`one_line`, so the line stays one
line).  ``VspecError(message)`` (one argument) takes a finished line.  Subclasses may render
the line differently (:meth:`VspecError.render`); the argument order stays the same
everywhere.

A leaf: imports nothing of ours.
"""

from __future__ import annotations


class VspecError(Exception):
    """``VspecError(source, field, message)`` or ``VspecError(message)``."""

    source: str | None
    field: str | None
    message: str

    def __init__(self, *args: str | None) -> None:
        if len(args) == 1:
            source, field, message = None, None, args[0]
        elif len(args) == 3:
            source, field, message = args
        else:
            raise TypeError(
                f"{type(self).__name__} takes (message) or (source, field, message), "
                f"got {len(args)} arguments"
            )
        self.source = one_line(source)
        self.field = one_line(field)
        self.message = "" if message is None else str(message)
        super().__init__(self.render())

    def render(self) -> str:
        """The one-line text (``str(error)``)."""
        return ": ".join(str(p) for p in (self.source, self.field, self.message) if p is not None)

    def __str__(self) -> str:
        return self.render()


def one_line(part: str | None) -> str | None:
    """``part`` with its line breaks escaped (``\\n``, ``\\r``): a key or file name as the
    user wrote it, put into a one-line message."""
    if part is None:
        return None
    part = str(part)
    return part.replace("\r", "\\r").replace("\n", "\\n")


class KeyedError(VspecError):
    """An error in a JSON document whose field is a key: ``"<source>: key '<field>' <message>"``
    (the form the profile and simulator-trace loaders print)."""

    def render(self) -> str:
        if self.field is None:
            return super().render()
        return f"{self.source}: key '{self.field}' {self.message}"
