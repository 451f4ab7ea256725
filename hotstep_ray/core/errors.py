"""Exceptions every layer raises. The CLI turns them into one red line and a non-zero exit."""

from __future__ import annotations


class HotstepError(Exception):
    """Base class: a failure the user can act on (bad input, missing file, bad config)."""


class InputError(HotstepError, ValueError):
    """The user's input is wrong: a missing folder, an unreadable sidecar, an invalid option."""


class StorageError(HotstepError, OSError):
    """A read or write through the storage layer failed, or a path escapes the storage root."""


class PathNotAllowedError(StorageError):
    """An output path lies outside every allowed root."""
