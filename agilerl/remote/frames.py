"""The OpenEnv WebSocket frames: the one place frames are built and parsed, on both sides.

Server side: client frames are validated straight from the raw text (pydantic parses the JSON),
so one call tells a malformed frame (INVALID_JSON), an unknown ``type`` (UNKNOWN_TYPE) and bad
fields (VALIDATION_ERROR) apart. Replies are built as plain dicts (the HTTP routes send their
``data``) and encoded with ``pydantic_core``: values JSON cannot hold (objects in ``info``, NaN)
become strings or null instead of failing. The env's ``info`` rides in the observation's
``metadata`` only for a session that asked for it (``/ws?metadata=1``): OpenEnv's server keeps
``metadata`` off the wire, and a generic client shows the whole observation to the model.

Client side: ``reset_frame``/``step_frame``/``STATE_FRAME``/``CLOSE_FRAME`` build requests;
``parse_reply`` and ``read_observation`` read any OpenEnv server's replies: leniently in their
layout (``metadata`` may sit in the observation, beside it, or nowhere), strictly in their values
(a reward is a finite number, ``done`` a bool: the protocol's rules, as for a local env), and
whatever a server says is shown through ``peer_text`` (bounded, control bytes escaped).
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated, Any, Literal, NamedTuple

import pydantic_core
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, with_config
from typing_extensions import NotRequired, TypedDict

from agilerl.errors import EnvProtocolError, validation_problems
from agilerl.protocol import MAX_ABS_REWARD, reset_kwargs, reward_problem, valid_text
from agilerl.remote.action_schema import ActionFields

__all__ = [
    "ErrorCode",
    "ResetData",
    "StepData",
    "ResetFrame",
    "StepFrame",
    "StateFrame",
    "CloseFrame",
    "McpFrame",
    "ClientFrame",
    "CLIENT_FRAME",
    "TextObservation",
    "FrameError",
    "parse_client_frame",
    "encode",
    "encode_reply",
    "unsendable",
    "decode",
    "INFO_QUERY",
    "observation_frame",
    "state_frame",
    "error_frame",
    "RpcCode",
    "RpcRequest",
    "rpc_result",
    "rpc_error",
    "parse_rpc",
    "mcp_frame",
    "schema",
    "STATE_FRAME",
    "CLOSE_FRAME",
    "reset_frame",
    "step_frame",
    "call_tool_frame",
    "LIST_TOOLS_FRAME",
    "Reply",
    "decode_peer",
    "parse_reply",
    "peer_text",
    "ObservationReply",
    "read_observation",
]


class ErrorCode(str, Enum):
    """The ``code`` of an error frame (OpenEnv's ``WSErrorCode``)."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"


# Client frames are TypedDicts: validated by pydantic-core straight from the raw text like
# models, but read as the dicts they are (half the cost of building two model instances a step).
# OpenEnv clients add fields of their own (episode_id, metadata): extra keys are ignored.
_LENIENT = ConfigDict(extra="ignore")


@with_config(_LENIENT)
class ResetData(TypedDict, total=False):
    seed: int | None
    row_index: Annotated[int | None, Field(ge=0, description="Dataset envs: the row to play.")]
    evaluation: Annotated[bool | None, Field(description="Dataset envs: draw from the test split.")]


def _scalar_as_text(value: Any) -> Any:
    """A number or bool stands for the text it was parsed from: clients that JSON-parse the
    model's reply (verifiers' openenv taskset) send ``"7"`` as ``7``."""
    if isinstance(value, (bool, int, float)):
        return encode(value).decode()
    return value


@with_config(_LENIENT)
class StepData(TypedDict):
    message: NotRequired[Annotated[str, BeforeValidator(_scalar_as_text), Field(
        description="The model's text (a JSON number or bool is taken as its text)."
    )]]
    type: NotRequired[Annotated[Literal["call_tool"], Field(
        description="With tool_name: one parsed tool call, as OpenEnv's MCP CallToolAction (the env's call_tool)."
    )]]
    tool_name: NotRequired[str]
    arguments: NotRequired[dict[str, Any]]


@with_config(_LENIENT)
class ResetFrame(TypedDict):
    type: Literal["reset"]
    data: NotRequired[ResetData]


@with_config(_LENIENT)
class StepFrame(TypedDict):
    type: Literal["step"]
    data: StepData


@with_config(_LENIENT)
class StateFrame(TypedDict):
    type: Literal["state"]


@with_config(_LENIENT)
class CloseFrame(TypedDict):
    type: Literal["close"]


@with_config(_LENIENT)
class McpFrame(TypedDict):
    type: Literal["mcp"]
    data: Annotated[dict[str, Any], Field(description="A JSON-RPC 2.0 request (tools/list, tools/call).")]


ClientFrame = Annotated[
    ResetFrame | StepFrame | StateFrame | CloseFrame | McpFrame, Field(discriminator="type")
]
CLIENT_FRAME: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)
_validate_client_frame = CLIENT_FRAME.validator.validate_json  # TypeAdapter's own wrapper costs a call a step


class TextObservation(BaseModel):
    """The observation our server sends: the env's text, its images (when it shows any),
    ``truncated``, and the info dict."""

    text: str
    images: list[str] | None = Field(
        None, description="The observation's images as base64 PNG/JPEG data URLs, shown before the text."
    )
    truncated: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)


class FrameError(Exception):
    """A client frame that cannot be served; becomes an error frame, the session goes on."""

    def __init__(self, code: ErrorCode, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra


def parse_client_frame(raw: str | bytes) -> ResetFrame | StepFrame | StateFrame | CloseFrame | McpFrame:
    """Validate one client frame (a dict whose ``type`` says which), or raise ``FrameError``
    with the matching code."""
    try:
        return _validate_client_frame(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        kinds = {e["type"] for e in errors}
        if "json_invalid" in kinds:
            raise FrameError(ErrorCode.INVALID_JSON, f"invalid JSON: {errors[0]['msg']}") from None
        if kinds & {"union_tag_invalid", "union_tag_not_found"}:
            raise FrameError(
                ErrorCode.UNKNOWN_TYPE,
                "unknown message type: 'type' must be one of reset, step, state, close, mcp.",
            ) from None
        details = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or '(frame)'}: {e['msg']}" for e in errors
        )
        raise FrameError(ErrorCode.VALIDATION_ERROR, f"invalid message: {details}", errors=errors) from None


def encode(frame: dict[str, Any]) -> bytes:
    """Encode a frame as JSON; unknown objects become strings, NaN/inf become null."""
    return pydantic_core.to_json(frame, serialize_unknown=True, inf_nan_mode="null")


def encode_reply(reply: dict[str, Any]) -> bytes:
    """A reply as JSON; one that JSON cannot carry (a lone surrogate in the env's ``info``) is
    answered with ``EXECUTION_ERROR`` instead, and the session goes on (the env's text never gets
    here unsendable: the protocol escapes it, ``valid_text``)."""
    try:
        return encode(reply)
    except pydantic_core.PydanticSerializationError as exc:
        return encode(unsendable(exc))


def unsendable(exc: Exception) -> dict[str, Any]:
    """The ``EXECUTION_ERROR`` frame for an env answer that cannot be encoded as JSON."""
    return error_frame(
        ErrorCode.EXECUTION_ERROR,
        f"the env's answer cannot be sent as JSON ({valid_text(str(exc))}); the session goes on",
    )


def decode(raw: str | bytes) -> Any:
    """Decode one JSON frame."""
    return pydantic_core.from_json(raw)


INFO_QUERY = "metadata"
"""``/ws?metadata=1``: the session asks for each observation's ``info`` (as ``metadata``)."""


def observation_frame(
    text: Any, reward: float, terminated: bool, truncated: bool, info: dict[str, Any] | None
) -> dict[str, Any]:
    """A step or reset reply; ``done`` is either end, ``truncated`` rides in the observation, and
    ``info`` only when given (None: the client did not ask for it). ``text`` is the observation:
    a str, or an ``ImageObservation`` whose images ride as data URLs (``images``)."""
    if type(text) is str:
        observation: dict[str, Any] = {"text": text, "truncated": truncated}
    else:
        observation = {**text.payload(), "truncated": truncated}
    if info is not None:
        observation["metadata"] = info
    return {"type": "observation", "data": {"observation": observation, "reward": reward, "done": terminated or truncated}}


def state_frame(state: dict[str, Any]) -> dict[str, Any]:
    return {"type": "state", "data": state}


def error_frame(code: ErrorCode, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code.value, **extra}}


# -- MCP JSON-RPC (HTTP ``/mcp`` and the ``{"type": "mcp", "data": <request>}`` frame) --------


class RpcCode(int, Enum):
    """JSON-RPC 2.0 error codes, as OpenEnv's ``JsonRpcErrorCode``."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    SERVER_ERROR = -32000


class RpcRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jsonrpc: Literal["2.0"]
    method: str
    params: dict[str, Any] = Field(default_factory=dict)
    id: str | int | None = None


def rpc_result(result: Any, request_id: str | int | None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def rpc_error(code: RpcCode, message: str, request_id: str | int | None = None, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code.value, "message": message, "data": data}}


def parse_rpc(payload: Any) -> RpcRequest | dict[str, Any]:
    """A JSON-RPC request, or the error response that answers a malformed one."""
    try:
        return RpcRequest.model_validate(payload)
    except ValidationError as exc:
        return rpc_error(RpcCode.INVALID_REQUEST, f"Invalid request: {'; '.join(validation_problems(exc))}")


def mcp_frame(response: dict[str, Any]) -> dict[str, Any]:
    return {"type": "mcp", "data": response}


def schema() -> dict[str, Any]:
    """What ``GET /schema`` returns: action, observation and state JSON Schemas."""
    return {
        "action": TypeAdapter(StepData).json_schema(),
        "observation": TextObservation.model_json_schema(),
        "state": {"type": "object", "additionalProperties": True},
    }


# -- the client side ---------------------------------------------------------------------------

STATE_FRAME = encode({"type": "state"})
CLOSE_FRAME = encode({"type": "close"})


def reset_frame(seed: int | None, row_index: int | None = None, evaluation: bool | None = None) -> bytes:
    """A reset request; ``row_index``/``evaluation`` are sent only when set (OpenEnv servers
    validate ``data`` against their own reset signature)."""
    return encode({"type": "reset", "data": {"seed": seed, **reset_kwargs(row_index, evaluation)}})


def step_frame(
    action: str, action_field: str = "message", mcp_tool: str | None = None, fields: ActionFields | None = None
) -> bytes:
    """A step request carrying ``action`` in ``action_field`` (filled by the server's Action schema
    when ``fields`` is given), or as the one argument of an MCP ``call_tool`` when ``mcp_tool`` is set."""
    action = valid_text(action)
    if mcp_tool:
        data: dict[str, Any] = {"type": "call_tool", "tool_name": mcp_tool, "arguments": {action_field: action}}
    else:
        data = fields.data(action) if fields is not None else {action_field: action}
    return encode({"type": "step", "data": data})


def call_tool_frame(name: str, arguments: dict[str, Any]) -> bytes:
    """A step request that runs one tool call on an MCP env (OpenEnv's ``CallToolAction``)."""
    return encode({"type": "step", "data": {"type": "call_tool", "tool_name": name, "arguments": arguments}})


LIST_TOOLS_FRAME = encode({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 1}})
"""The JSON-RPC ``tools/list`` over the session's WebSocket (the ``mcp`` frame)."""


class Reply(NamedTuple):
    """A server frame: its ``type`` and ``data`` (None when absent); ``type`` is None when the
    frame is not a JSON object, and ``data`` then holds the raw text."""

    type: str | None
    data: Any

    @property
    def error(self) -> tuple[str | None, str] | None:
        """``(code, message)`` of an error frame; None for any other frame. The per-field
        ``errors`` of a validation error (OpenEnv's server sends only "Invalid message" beside
        them) are kept in the message: ``field: what is wrong`` for each."""
        if self.type != "error":
            return None
        data = self.data if isinstance(self.data, dict) else {}
        message = str(data.get("message", ""))
        fields = _field_errors(data.get("errors"), message)
        code = data.get("code")
        return (
            (code if code in _CODES else peer_text(code, 40)) if isinstance(code, str) else None,
            peer_text(f"{message} ({fields})" if fields else message, MAX_PEER_TEXT),
        )


_CODES = frozenset(code.value for code in ErrorCode)
MAX_PEER_TEXT = 2000
"""The most characters of a server's own words (an error message) an error carries."""


def peer_text(value: Any, limit: int = 300) -> str:
    """What a peer said, safe to print: at most ``limit`` characters (the rest counted, never
    read whole), control bytes, lone surrogates and other unprintables escaped (``\\x1b``), so no
    terminal sequence gets through."""
    text = value if isinstance(value, str) else repr(value)
    more = len(text) - limit
    if more > 0:
        text = text[:limit]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return f"{text}... ({more} more characters)" if more > 0 else text


def _field_errors(errors: Any, message: str) -> str:
    """pydantic's error list as ``loc: msg; ...``, leaving out what ``message`` already says."""
    if not isinstance(errors, list):
        return ""
    parts = [
        f"{'.'.join(str(p) for p in e.get('loc', ())) or '(frame)'}: {e.get('msg', '')}"
        for e in errors
        if isinstance(e, dict) and str(e.get("msg", "")) not in message
    ]
    return "; ".join(parts)


def decode_peer(raw: str | bytes) -> Any:
    """Decode JSON a server sent (``ValueError`` when it is not JSON). Python's ``json`` (OpenEnv's
    servers, aiohttp's ``json_response``) writes a lone surrogate as the escape ``"\\ud800"``,
    which pydantic-core's parser refuses: that text is read by ``json`` instead."""
    try:
        return decode(raw)
    except ValueError:
        return json.loads(raw)


def parse_reply(raw: str | bytes) -> Reply:
    """Read one server frame, never raising: a malformed one comes back with ``type`` None."""
    try:
        frame = decode_peer(raw)
    except ValueError:
        frame = None
    if not isinstance(frame, dict):
        return Reply(None, raw if isinstance(raw, str) else raw.decode("utf-8", "replace"))
    kind = frame.get("type")
    return Reply(kind if isinstance(kind, str) else "", frame.get("data"))


class ObservationReply(NamedTuple):
    """An observation frame's ``data``, read leniently; ``observation`` still needs its text read
    out (which field holds it is the client's configuration)."""

    observation: dict[str, Any]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def read_observation(data: Any) -> ObservationReply:
    """Read an observation reply's ``data``. ``done`` and ``truncated`` may sit beside the
    observation or in it; ``metadata`` in both is merged. Values are held to the protocol's rules
    (``EnvProtocolError`` names the field): a reward is a finite number (null or absent: 0), ``done``
    and ``truncated`` are JSON booleans (absent: false), as a local env's step is checked."""
    if not isinstance(data, dict):
        raise EnvProtocolError(f"data must be an object, got {peer_text(data, 80)}")
    observation = data.get("observation")
    if not isinstance(observation, dict):
        observation = {} if observation is None else {"observation": observation}
    info: dict[str, Any] = {}
    for metadata in (data.get("metadata"), observation.get("metadata")):
        if isinstance(metadata, dict):
            info.update(metadata)
    truncated = observation.get("truncated", _ABSENT)
    if truncated is _ABSENT:
        truncated = data.get("truncated")
    done = data.get("done", _ABSENT)
    if done is _ABSENT:
        done = observation.get("done")
    if not (_is_flag(truncated) and _is_flag(done)):
        _refuse_flags(data, observation)
    reward = data.get("reward", _ABSENT)
    where = "data"
    if reward is _ABSENT:
        reward, where = observation.get("reward"), "data.observation"
    if reward is None:
        reward = 0.0
    elif type(reward) is not float or not -MAX_ABS_REWARD <= reward <= MAX_ABS_REWARD:  # NaN too: the full rule
        problem = reward_problem(reward)
        if problem is not None:
            raise EnvProtocolError(f"{where}.reward {problem}")
    done, truncated = done is True, truncated is True
    return ObservationReply(observation, float(reward), done and not truncated, truncated, info)


_ABSENT: Any = object()


def _is_flag(value: Any) -> bool:
    """What a ``done``/``truncated`` may be: a JSON boolean, null or absent (never ``1``)."""
    return value is True or value is False or value is None or value is _ABSENT


def _refuse_flags(data: dict[str, Any], observation: dict[str, Any]) -> None:
    """Raise ``EnvProtocolError`` naming the ``done``/``truncated`` that is not a JSON boolean: a
    string such as ``"false"`` is refused, never read by its truthiness."""
    for name, places in (
        ("done", (("data", data), ("data.observation", observation))),
        ("truncated", (("data.observation", observation), ("data", data))),
    ):
        for where, holder in places:
            if name in holder:
                value = holder[name]
                if value is not None and value is not True and value is not False:
                    raise EnvProtocolError(f"{where}.{name} must be a JSON boolean, got {peer_text(repr(value), 80)}")
                break
