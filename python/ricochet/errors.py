"""The exceptions of the ricochet package: one class per kind of the Rust
client's ``ErrorKind``, all subclasses of :class:`RicochetError`.

Every instance carries what the Rust error carries: ``kind`` (a string such
as ``"not_found"``), ``grpc_code`` (the broker's gRPC status code when it
answered, else ``None``), ``retryable``, ``redirect`` (a dict with ``owner``,
``url``, ``epoch`` for :class:`RedirectError` and :class:`OwnerDownError`),
``unconfirmed_count`` (:class:`UnconfirmedError`) and ``causes`` (the Rust
cause chain, outermost first). Match on the class, or on ``kind``; never on
the message.
"""

from __future__ import annotations

import builtins
from typing import Any, Dict, List, Optional

__all__ = [
    "RicochetError",
    "NotFoundError",
    "AlreadyExistsError",
    "InvalidArgumentError",
    "PermissionDeniedError",
    "UnauthenticatedError",
    "FailedPreconditionError",
    "ResourceExhaustedError",
    "DisconnectedError",
    "UnavailableError",
    "OwnerDownError",
    "RedirectError",
    "RicochetTimeoutError",
    "ClosedError",
    "QueueFullError",
    "StaleDeliveryError",
    "UnconfirmedError",
    "PolicyError",
    "DataLossError",
    "InternalError",
]


class RicochetError(Exception):
    """Base class of every error the client raises (kind ``other`` when no
    subclass fits)."""

    def __init__(
        self,
        message: str,
        *,
        kind: str = "other",
        grpc_code: Optional[int] = None,
        retryable: bool = False,
        redirect: Optional[Dict[str, Any]] = None,
        unconfirmed_count: Optional[int] = None,
        causes: Optional[List[str]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.grpc_code = grpc_code
        self.retryable = retryable
        self.redirect = redirect
        self.unconfirmed_count = unconfirmed_count
        self.causes = list(causes or [])


class NotFoundError(RicochetError):
    """The topic, subscription or other named thing does not exist."""


class AlreadyExistsError(RicochetError):
    """It exists already."""


class InvalidArgumentError(RicochetError, ValueError):
    """The request cannot work as given (refused by the broker, or found by
    the client before sending anything)."""


class PermissionDeniedError(RicochetError):
    """The caller's role lacks the permission."""


class UnauthenticatedError(RicochetError):
    """No valid credentials."""


class FailedPreconditionError(RicochetError):
    """The request conflicts with the current state (an Exclusive
    subscription already taken, ...)."""


class ResourceExhaustedError(RicochetError):
    """A limit of the broker's was reached."""


class DisconnectedError(RicochetError, builtins.ConnectionError):
    """The broker could not be reached, or the connection broke."""


class UnavailableError(RicochetError):
    """The broker cannot serve now (shutting down, a topic moving)."""


class OwnerDownError(RicochetError):
    """The broker owning the topic is down or fenced; ``redirect`` names it."""


class RedirectError(RicochetError):
    """The broker asked does not own the topic; ``redirect`` names the owner."""


class RicochetTimeoutError(RicochetError, builtins.TimeoutError):
    """An operation did not complete within its deadline."""


class ClosedError(RicochetError):
    """The producer, consumer or client was closed."""


class QueueFullError(RicochetError):
    """The producer's queue is full and it was made with
    ``block_if_queue_full=False``."""


class StaleDeliveryError(RicochetError):
    """The message arrived before the consumer reconnected; the broker
    redelivers it, settle that delivery instead."""


class UnconfirmedError(RicochetError):
    """Acks the broker never confirmed durable; ``unconfirmed_count`` says
    how many (the broker redelivers those messages)."""


class PolicyError(RicochetError, ValueError):
    """A dead-letter policy spec that does not parse or validate."""


class DataLossError(RicochetError):
    """The broker holds damaged or incomplete data."""


class InternalError(RicochetError):
    """The broker (or the bindings) failed internally."""
