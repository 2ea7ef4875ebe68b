"""The controller's exceptions: each one carries the HTTP status it maps to and a message that says what to do.

Foreign errors (pyetcd's, grpc's) are translated into these once, in store.py; the HTTP layer turns these into
responses in one place (http_api.py). Nothing else belongs here.
"""
from __future__ import annotations


class ControllerError(Exception):
    """Base class. ``status`` is the HTTP status; ``code`` a stable machine-readable word."""

    status = 500
    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(ControllerError):
    """The request is malformed: a missing or ill-typed field, an unknown parameter value."""

    status = 400
    code = "bad_request"


class Unauthorized(ControllerError):
    """A member-only endpoint was called without a valid cluster-key signature (docs/security.md)."""

    status = 401
    code = "unauthorized"


class Forbidden(ControllerError):
    """A member's signature is valid, but the record it touches is another member's (or another session's)."""

    status = 403
    code = "forbidden"


class NotFound(ControllerError):
    """The named host or allocation is not in the pool (never registered, released, or its lease expired)."""

    status = 404
    code = "not_found"


class Unsatisfiable(ControllerError):
    """A well-formed request that the pool cannot meet; ``code`` says which limit was hit."""

    status = 409

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class WrongHost(ControllerError):
    """An oriond tried to take up an allocation granted on another host."""

    status = 409
    code = "wrong_host"


class AlreadyBound(ControllerError):
    """An allocation is bound to one session already: one grant backs exactly one session."""

    status = 409
    code = "already_bound"


class WrongSession(ControllerError):
    """A GPU host released an allocation for a session that is not the one bound to it."""

    status = 409
    code = "wrong_session"


class Contention(ControllerError):
    """Other controllers kept winning the same vGPUs until our bounded retries ran out; retrying is safe."""

    status = 503
    code = "contention"


class EtcdUnavailable(ControllerError):
    """etcd did not answer (down, unreachable, or too slow): nothing was decided, so nothing wrong was said."""

    status = 503
    code = "etcd_unavailable"


class EtcdRefused(ControllerError):
    """etcd answered but refused the operation (a bug or a misconfigured etcd, not an outage)."""

    status = 500
    code = "etcd_error"
