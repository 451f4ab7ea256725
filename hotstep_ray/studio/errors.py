"""Studio errors and the HTTP status each one answers with.

The stages raise `core.errors` exceptions; the studio adds the REST-only cases (not found,
conflict, not built yet, unavailable). One table maps them all, most specific first.
"""

from __future__ import annotations

from hotstep_ray.core.errors import HotstepError, InputError, PathNotAllowedError


class NotFoundError(HotstepError):
    """The dataset, sample or job a URL names does not exist (404)."""


class ConflictError(HotstepError):
    """The request clashes with current state: a running job, an existing dataset (409)."""


class StageUnavailableError(HotstepError):
    """The stage's code is not in this build yet (501)."""


class ServiceUnavailableError(HotstepError):
    """Something the request explicitly asked for (a provider key, Essentia) is missing (503)."""


STATUS_BY_ERROR: tuple[tuple[type[Exception], int], ...] = (
    (PathNotAllowedError, 403),
    (NotFoundError, 404),
    (ConflictError, 409),
    (StageUnavailableError, 501),
    (ServiceUnavailableError, 503),
    (InputError, 422),
    (HotstepError, 500),
)


def status_of(exc: Exception) -> int:
    for cls, status in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return status
    return 500
