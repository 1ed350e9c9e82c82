"""Errors that reach the user; the CLI prints them as `fairway: error: <msg>` (exit code 2)."""


class FairwayError(Exception):
    """Base of every error Fairway raises for bad input or configuration."""


class FairwayConfigError(FairwayError, ValueError):
    """A bad option: the message names the key, the value, its source and what is allowed."""


class ProfileError(FairwayError, ValueError):
    """A prefill-time profile table that cannot be used (file, format or values)."""


class TraceError(FairwayError, ValueError):
    """A trace file or trace-building argument that cannot be used."""
