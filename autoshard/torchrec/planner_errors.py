"""The drop-in planner's errors as TorchRec's: ``PlannerError`` with its ``PlannerErrorType``.

A training script written for TorchRec's planner catches
``torchrec.distributed.planner.types.PlannerError`` and reads its ``error_type``
(``INSUFFICIENT_STORAGE``, ``STRICT_CONSTRAINTS``, ...). The drop-in planner raises
:class:`AutoshardPlannerError`, which is both that and our :class:`autoshard.errors.PlannerError`
(``kind``, and the message with the numbers involved), and for a model or statistics autoshard
cannot take :class:`AutoshardInputError`, both TorchRec's ``PlannerError``
(``INPUT_VALIDATION``) and our :class:`autoshard.errors.InputError`. Each kind of ours maps to
one of TorchRec's types (:data:`ERROR_TYPES`); an error TorchRec raised itself (its storage
reservation, its validation of the plan) keeps its type.

The classes subclass TorchRec's, so they are made when first asked for (this module's
``__getattr__``), which imports TorchRec: ``from autoshard.torchrec.planner_errors import
AutoshardPlannerError``.
"""

from __future__ import annotations

import functools
from typing import Any

from autoshard.errors import InputError, PlannerError

#: TorchRec's ``PlannerErrorType`` (by name) of each kind of our PlannerError; any other kind
#: is ``OTHER``.
ERROR_TYPES = {"capacity": "INSUFFICIENT_STORAGE", "constraint": "STRICT_CONSTRAINTS",
               "unsupported": "INPUT_VALIDATION"}
_NAMES = ("AutoshardPlannerError", "AutoshardInputError")


def error_type_of(kind: str) -> Any:
    """TorchRec's ``PlannerErrorType`` of our error ``kind`` (:data:`ERROR_TYPES`)."""
    from torchrec.distributed.planner.types import PlannerErrorType

    return PlannerErrorType[ERROR_TYPES.get(kind, "OTHER")]


def as_torchrec_error(exc: Exception) -> Exception:
    """``exc`` as the drop-in planner raises it: ours (PlannerError, InputError) or TorchRec's
    PlannerError become :class:`AutoshardPlannerError` or :class:`AutoshardInputError` with
    the same message; anything else is returned as it is."""
    from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError

    classes = _classes()
    if isinstance(exc, tuple(classes.values())):
        return exc
    if isinstance(exc, InputError):
        return classes["AutoshardInputError"](exc.reason, source=exc.source, field=exc.field,
                                              value=exc.value)
    if isinstance(exc, PlannerError):
        return classes["AutoshardPlannerError"](exc.kind, str(exc), error_type_of(exc.kind))
    if isinstance(exc, TorchRecPlannerError):
        return classes["AutoshardPlannerError"]("torchrec", str(exc), exc.error_type)
    return exc


def __getattr__(name: str) -> type:
    if name in _NAMES:
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _classes() -> dict[str, type]:
    """The two error classes, made once (they subclass TorchRec's PlannerError)."""
    from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError
    from torchrec.distributed.planner.types import PlannerErrorType

    class AutoshardPlannerError(PlannerError, TorchRecPlannerError):
        """Planning failed: our ``kind`` and TorchRec's ``error_type``, the message ours.

        Args:
            kind: Our category (:class:`autoshard.errors.PlannerError`).
            message: What failed, with the numbers involved.
            error_type: TorchRec's ``PlannerErrorType`` (default: the one of ``kind``).
        """

        def __init__(self, kind: str, message: str, error_type: Any = None) -> None:
            self.kind = kind
            self.error_type = error_type_of(kind) if error_type is None else error_type
            Exception.__init__(self, message)

        def __reduce__(self) -> tuple[Any, ...]:
            return type(self), (self.kind, str(self), self.error_type)

    class AutoshardInputError(InputError, TorchRecPlannerError):
        """A model, statistic or constraint autoshard cannot take: our InputError (source,
        field, value) that is TorchRec's ``PlannerError`` of type ``INPUT_VALIDATION``."""

        error_type = PlannerErrorType.INPUT_VALIDATION

        def __reduce__(self) -> tuple[Any, ...]:
            return _input_error, (self.reason, self.source, self.field, self.value)

    for cls in (AutoshardPlannerError, AutoshardInputError):  # pickled by this module's name
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return {"AutoshardPlannerError": AutoshardPlannerError,
            "AutoshardInputError": AutoshardInputError}


def _input_error(reason: str, source: str | None, field: str | None, value: object
                 ) -> Exception:
    """An :class:`AutoshardInputError` again (unpickling)."""
    return _classes()["AutoshardInputError"](reason, source=source, field=field, value=value)
