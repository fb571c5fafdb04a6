"""The project's error types: one for bad input, one for planning failures, and the signal
of a phase that ran out of time."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: names the source (file), the field and the offending value.

    Args:
        message: What is wrong and, where possible, what to do about it.
        source: The file (or other origin, such as a CLI option) the value came from.
        field: The field, column or option that holds the bad value.
        value: The offending value itself.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        field: str | None = None,
        value: object = None,
    ) -> None:
        self.reason = message
        self.source = source
        self.field = field
        self.value = value
        parts = []
        if source:
            parts.append(str(source))
        if field:
            parts.append(f"field '{field}'")
        if value is not None:
            text = repr(value)
            parts.append(f"value {text if len(text) <= 80 else text[:77] + '...'}")
        prefix = ", ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message)

    def located(self, source: str, prefix: str = "") -> InputError:
        """The same error attributed to ``source``, its field under ``prefix`` when given."""
        field = self.field
        if prefix and field and not field.startswith(prefix + "."):
            field = f"{prefix}.{field}"
        return InputError(self.reason, source=source, field=field, value=self.value)


class PlannerError(RuntimeError):
    """A sharding task that cannot be planned, or a plan that breaks a constraint.

    Args:
        kind: A short machine-readable category, e.g. ``"capacity"`` or ``"invalid_plan"``.
        message: A sentence with the numbers involved.
    """

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class DeadlineReached(Exception):
    """Raised by a phase that was given a deadline (a ``time.perf_counter`` instant) and
    reached it before finishing; the caller falls back to what it already has."""


def gib(num_bytes: float) -> str:
    """Formats a byte count as GiB with one decimal, for error messages."""
    return f"{num_bytes / 2**30:.2f} GiB"
