"""The env server's default limits and the constants its clients share, in a module of their own
so ``agilerl serve --help`` can show them without importing the server (and aiohttp)."""

__all__ = [
    "TOKEN_ENV_VAR",
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
