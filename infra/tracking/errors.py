"""One exception root for tracking."""

from __future__ import annotations

__all__ = ["MissingTrackerPackage", "TrackingError"]


class TrackingError(Exception):
    """A tracker cannot be built or fed; the message is one line."""


class MissingTrackerPackage(TrackingError):
    """The library a tracker writes with is not installed; the message names the extra."""
