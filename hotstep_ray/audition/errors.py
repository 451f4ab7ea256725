"""Audition errors, each with the HTTP status the ingress answers with."""

from __future__ import annotations

from hotstep_ray.core.errors import HotstepError, InputError


class NotFoundError(InputError):
    """An adapter, preview or file that does not exist (404)."""

    status = 404


class TooLargeError(InputError):
    """A request over a size limit: more than 600 s of codes, a body over the cap (413)."""

    status = 413


class EngineSuspendedError(HotstepError):
    """The audition engine is released for a training job (503)."""

    status = 503


def http_status(exc: BaseException) -> int:
    """4xx/5xx for an exception raised by the audition classes; 500 for anything unknown."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    if isinstance(exc, InputError | ValueError):
        return 400
    return 500
