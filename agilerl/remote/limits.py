"""The env server's default limits and the constants its clients share, in a module of their own
so ``agilerl serve --help`` can show them without importing the server (and aiohttp)."""

from agilerl.errors import InvalidArgument
from agilerl.peers import clean_secret

__all__ = [
    "TOKEN_ENV_VAR",
    "clean_token",
    "DEFAULT_MAX_CONCURRENT_ENVS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_KEEPALIVE_TIMEOUT_S",
    "DEFAULT_SEND_TIMEOUT_S",
    "DEFAULT_CLOSE_TIMEOUT_S",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_BACKLOG",
]

TOKEN_ENV_VAR = "AGILERL_ENV_TOKEN"  # the bearer token, read by `agilerl serve` and every client

DEFAULT_MAX_CONCURRENT_ENVS = 64
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
DEFAULT_HEADER_TIMEOUT_S = 10.0  # nginx: client_header_timeout 60 s; uvicorn: keep-alive 5 s
DEFAULT_KEEPALIVE_TIMEOUT_S = 15.0
DEFAULT_SEND_TIMEOUT_S = 30.0  # nginx: send_timeout 60 s; websockets: ping_timeout 20 s
DEFAULT_CLOSE_TIMEOUT_S = 2.0  # websockets: close_timeout 10 s
DEFAULT_HEARTBEAT_S = 30.0
DEFAULT_BACKLOG = 128


def clean_token(token: str | None, source: str) -> str | None:
    """The bearer token as both sides send and compare it: surrounding whitespace (a file's
    trailing newline) stripped, so a client and ``agilerl serve`` given the same file agree;
    None when unset. ``InvalidArgument`` naming ``source`` (``--token``, ``$AGILERL_ENV_TOKEN``)
    when it is blank or holds what an HTTP header cannot carry."""
    if token is not None and not token.strip():
        raise InvalidArgument(
            f"{source} is blank, which would turn authentication off; give the real token or unset it."
        )
    return clean_secret(token, source, "a bearer token (RFC 6750)")
