"""The one base class for errors a user can fix; the CLI prints these without a traceback."""


class AgileRLError(Exception):
    """An error whose message names what went wrong and how to fix it."""
