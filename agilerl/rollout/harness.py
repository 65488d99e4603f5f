"""RolloutHarness: a text env seen as tokens, the way a policy model sees it.

It renders the conversation with the tokenizer's chat template, turns generated tokens into the
env's action text and observations into the next user turn, enforces the turn budget, and records
the trajectory training needs. Each turn renders and tokenizes only the new text, so a turn costs
the same at turn 200 as at turn 1.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from agilerl.chat import ChatRenderer, EpisodeChat
from agilerl.envs.client import InProcessEnvClient, as_client
from agilerl.errors import AgileRLWarning, EpisodeError, InvalidArgument
from agilerl.protocol import EnvInfo, StepResult
from agilerl.rollout.context_policy import CONTEXT_POLICIES, ContextPolicy, Conversation, rewrite
from agilerl.rollout.tool_routing import TOOL_CALLS_INFO, TURN_TOOL_CALLS, ToolCallingClient, ToolRouting
from agilerl.tools.metrics import count_calls
from agilerl.rollout.trajectory import Trajectory
from agilerl.generation.media import VisionMedia
from agilerl.rollout.vision import VisionTurns, image_parts, text_only

if TYPE_CHECKING:
    from agilerl.manifest.spec import EnvironmentSpec

__all__ = ["TokenView", "RolloutHarness"]


class TokenView(Sequence[int]):
    """A read-only view of the first ``n`` conversation tokens: handing out a prompt copies nothing."""

    __slots__ = ("_ids", "_n", "media")

    def __init__(self, ids: list[int], n: int, media: VisionMedia | None = None) -> None:
        self._ids = ids
        self._n = n
        self.media = media
        """The episode's images (``agilerl.rollout.vision``), which a policy generates with; None for text."""

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return self._ids[: self._n][i]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self._ids[i if i >= 0 else self._n + i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids[: self._n])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (TokenView, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def tolist(self) -> list[int]:
        return self._ids[: self._n]

    def __repr__(self) -> str:
        return f"TokenView({self.tolist()!r})"


class RolloutHarness:
    """Drives one env episode in token space and accumulates its ``Trajectory``."""

    def __init__(
        self,
        env: Any,
        tokenizer: Any,
        *,
        max_turns: int | None = None,
        system_prompt: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        observation_role: str = "user",
        renderer: ChatRenderer | None = None,
        tool_parser: Any = None,
        send_reasoning: bool = False,
        context_policy: ContextPolicy = "error",
        **client_options: Any,
    ) -> None:
        """``env`` is a client (``InProcessEnvClient``/``RemoteEnvClient``), a text env, or a URL.

        ``max_turns``, ``system_prompt`` and ``tools`` default to what the env declares (its
        client's ``describe()``).
        ``renderer`` lets many harnesses over the same kind of env share one ``ChatRenderer`` (and
        its prompt cache); it must have been built for the same tokenizer, tools and template kwargs.
        ``client_options`` (with a URL) are ``RemoteEnvClient``'s: ``action_field``, ``mcp_tool``,
        ``observation_field``, ``observation_processor``, ``request_timeout_s``, ``token``, ...
        ``tool_parser`` (a registered name such as ``hermes``, or ``auto``) parses each completion's
        tool calls and runs them as the env's ``call_tool``; reasoning then reaches the env only
        with ``send_reasoning`` (``agilerl.rollout.tool_routing``, docs/tools.md).
        ``context_policy`` (``error``, ``truncate``, ``restart``) is what ``make_room`` does when
        the conversation outgrows the context (``agilerl.rollout.context_policy``).
        """
        if client_options and not isinstance(env, str):
            named = ", ".join(f"{k}={v!r}" for k, v in client_options.items())
            raise InvalidArgument(
                f"{named} applies to an env given as a URL (the harness builds its "
                "RemoteEnvClient); pass it to RemoteEnvClient(url, ...) for a client you "
                "built, and an in-process env receives the model's text in step() directly."
            )
        if isinstance(env, str):
            from agilerl.remote.client import RemoteEnvClient

            env = RemoteEnvClient(env, **client_options)
        self.client = as_client(env)
        self.tool_routing = None if tool_parser is None else ToolRouting.build(tool_parser, tokenizer, send_reasoning=send_reasoning)
        """Parses calls and renders their results; None: the env gets the completion's text."""
        if self.tool_routing is not None:
            self.client = ToolCallingClient(self.client)
        self.info: EnvInfo = self.client.describe()
        """What the env declares about itself."""
        if self.tool_routing is not None and self.info.send_reasoning:
            self.tool_routing.send_reasoning = True  # the env opted in to the model's reasoning
        self.max_turns = self.info.turn_budget(max_turns)
        if context_policy not in CONTEXT_POLICIES:
            raise InvalidArgument(f"context_policy must be one of {', '.join(CONTEXT_POLICIES)}, got {context_policy!r}")
        self.context_policy = context_policy
        self._conversation: Conversation | None = None
        """The episode as text messages, kept for a context rewrite (None under ``error``)."""
        self.vision = VisionTurns.of(tokenizer)
        """Renders image observations with the model's processor (a processor given as
        ``tokenizer``, or carried by it); None: the model reads text only, unless the tokenizer
        frames messages for a chat endpoint that reads images itself (``takes_image_parts``)."""
        self._image_parts = self.vision is None and bool(getattr(tokenizer, "takes_image_parts", False))
        if self.vision is not None and context_policy != "error":
            raise InvalidArgument(
                f"context_policy {context_policy!r} rewrites a conversation from its text, and a vision "
                "model's holds images: use context_policy 'error' with a vision model"
            )
        tokenizer = tokenizer if self.vision is None else self.vision.tokenizer
        self.tokenizer = tokenizer
        self.defaults = EpisodeChat(
            system_prompt=system_prompt if system_prompt is not None else self.info.system_prompt,
            tools=tools if tools is not None else self.info.tools,
            observation_role=observation_role,
        )
        """The framing of episodes whose reset info does not set their own (``EPISODE_CHAT_KEYS``)."""
        self.chat = self.defaults
        """The current episode's framing: ``defaults`` overridden by its reset info."""
        self._renderers = renderer or ChatRenderer(
            tokenizer, tools=self.defaults.tools, chat_template_kwargs=chat_template_kwargs
        )
        self.renderer = self._renderers
        """The renderer of the current episode (its tools); ``renderer_for`` picks one per episode."""
        self._unrendered_roles: set[str] = set()
        self._trajectory: Trajectory | None = None
        self._turn = 0
        self._done = True
        self._closed = False
        self._pending: tuple[list[int], Sequence[float] | None, int | None] | None = None

    @classmethod
    def local(cls, env: Any, tokenizer: Any, max_turns: int | None = None, **kwargs: Any) -> RolloutHarness:
        """A harness over an env object in this process; ``max_turns`` defaults to the env's own.

        ``mcp_tool`` is refused here: an in-process env gets the model's text in ``step`` directly.
        """
        return cls(InProcessEnvClient(env), tokenizer, max_turns=max_turns, **kwargs)

    @classmethod
    def from_spec(
        cls,
        spec: EnvironmentSpec,
        tokenizer: Any,
        *,
        base_dir: str | Path | None = None,
        mcp_tool: str | None = None,
        **kwargs: Any,
    ) -> RolloutHarness:
        """Build the env a manifest's ``environment:`` section names, with its turn budget (else
        the env's own); ``mcp_tool`` overrides the section's (with ``env_url`` or an OpenEnv MCP
        entrypoint). The mapping lives in ``agilerl.assembly.from_spec``."""
        from agilerl.assembly.from_spec import harness_from_spec  # the door: see [tool.importlinter]

        return harness_from_spec(cls, spec, tokenizer, base_dir=base_dir, mcp_tool=mcp_tool, **kwargs)

    @property
    def trajectory(self) -> Trajectory:
        """The episode so far (or the last finished one)."""
        if self._trajectory is None:
            raise EpisodeError("no episode yet: call reset() first")
        return self._trajectory

    @property
    def done(self) -> bool:
        return self._done

    def reset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[TokenView, dict[str, Any]]:
        """Start an episode; return the prompt as token ids ready for generation, and the env info."""
        self._check_open()
        result = self.client.reset(seed, row_index=row_index, evaluation=evaluation)
        return self.apply_reset(result, seed=seed, row_index=row_index)

    def apply_reset(
        self, result: tuple[str, dict[str, Any]], *, seed: int | None = None, row_index: int | None = None
    ) -> tuple[TokenView, dict[str, Any]]:
        """The second half of ``reset``, for a caller that ran ``client.reset`` (or ``areset``)
        itself, e.g. for many envs at once."""
        self._check_open()
        prompt, info = result
        self.chat = self.defaults.for_episode(info, self.info.name)
        self.renderer = self._renderers.with_tools(self.chat.tools)
        media = None if self.vision is None else VisionMedia()
        self._conversation = None
        if media is None:
            opening = self.chat.opening(self._content(prompt), info)
            ids = self.renderer.prompt_ids(opening)
            if self.context_policy != "error":
                self._conversation = Conversation(list(opening))
        else:
            ids = self.vision.opening(self.renderer, self.chat, prompt, info, media, f"{self.info.name}.reset()")
        self._trajectory = Trajectory(
            token_ids=ids,
            action_mask=[False] * len(ids),
            turn_ids=[-1] * len(ids),
            seed=seed,
            row_index=row_index,
            info=info,
            media=media,
        )
        self._turn = 0
        self._done = False
        self._pending = None
        return TokenView(ids, len(ids), media), info

    def step(
        self, completion: Sequence[int] | str, *, logprobs: Sequence[float] | None = None, version: int | None = None
    ) -> tuple[TokenView, float, bool, bool, dict[str, Any]]:
        """Send one completion (generated token ids, or text) to the env; return the next prompt.
        ``version`` is the policy version that generated it (``Trajectory.versions``)."""
        return self.apply_step(self.client.step(self.prepare_step(completion, logprobs=logprobs, version=version)))

    def prepare_step(
        self, completion: Sequence[int] | str, *, logprobs: Sequence[float] | None = None, version: int | None = None
    ) -> str:
        """The first half of ``step``: check the episode is live, return the env's action text.

        Send it with ``client.step`` (or ``await client.astep``), then pass the result to
        ``apply_step``: many envs can then be stepped at once while this object stays single-threaded.
        """
        self.trajectory
        if self._done:
            raise EpisodeError("the episode has ended: call reset() before step()")
        if isinstance(completion, str):
            action_text, action_ids = completion, self.renderer.encode(completion)
        else:
            action_ids = list(completion)
            if self.vision is not None and (cut := self.vision.sampled_placeholder(action_ids)) is not None:
                action_ids, logprobs = self.vision.end_at_placeholder(self.trajectory, action_ids, logprobs, cut)
            ended = bool(action_ids) and action_ids[-1] == self.renderer.end_of_turn_id
            body = action_ids[:-1] if ended else action_ids
            action_text = self.renderer.decode(body)
        if self.tool_routing is not None:
            action_text = self.tool_routing.action(completion, self.chat.tools)
        self._pending = (action_ids, logprobs, version)
        return action_text

    def apply_step(self, result: StepResult) -> tuple[TokenView, float, bool, bool, dict[str, Any]]:
        """The second half of ``step``: record the env's answer to the prepared completion."""
        if self._pending is None:
            raise EpisodeError("apply_step() needs a prepare_step() first")
        (action_ids, logprobs, version), self._pending = self._pending, None
        traj = self.trajectory
        observation, reward, terminated, truncated, info = result
        self._turn += 1
        if traj.media is not None and traj.media.ended:  # the model sampled an image placeholder
            observation, truncated = "", True
        truncated = truncated or (not terminated and self._turn >= self.max_turns)
        self._done = terminated or truncated
        tail = None
        if self.tool_routing is not None:
            tail = self.tool_routing.tail_ids(self.renderer, info, final=self._done, action_ids=action_ids)
            count_calls(traj.info, info.get(TOOL_CALLS_INFO))
            traj.info.setdefault(TURN_TOOL_CALLS, []).append(list(info.get(TOOL_CALLS_INFO) or []))
        role = self.observation_role_for(info)
        self._append_turn(action_ids, logprobs, version, role, observation, tail)
        if self._conversation is not None:
            body = action_ids[:-1] if action_ids and action_ids[-1] == self.renderer.end_of_turn_id else action_ids
            self._conversation.add_turn(self.renderer.decode(body), role, str(observation))
        traj.rewards.append(reward)
        _add_components(traj.info, info)
        traj.terminated, traj.truncated = terminated, truncated
        return TokenView(traj.token_ids, len(traj.token_ids), traj.media), reward, terminated, truncated, info

    def make_room(self, limit: int, target: int | None = None) -> TokenView | None:
        """Rewrite the conversation by ``context_policy`` into a prompt of at most ``limit``
        tokens (``target`` when it can), opening a new training sample (``Trajectory.split``, the
        closed one cut after its last generated token); the new prompt, or None when the policy
        is ``error`` or cannot fit one (the episode then goes on as it is)."""
        if self._conversation is None or self._done:
            return None
        hook = getattr(getattr(self.client, "env", None), "restart_prompt", None)  # in-process envs
        ids = rewrite(
            self.context_policy,
            self._conversation,
            lambda messages: self.renderer.encode(self.renderer.render_text(messages, add_generation_prompt=True)),
            limit,
            target=target,
            restart_prompt=hook if callable(hook) else None,
            env_name=self.info.name,
        )
        if ids is None:
            return None
        traj = self.trajectory
        end = next((i + 1 for i in range(len(traj.action_mask) - 1, -1, -1) if traj.action_mask[i]), 0)
        traj.token_ids, traj.action_mask, traj.turn_ids = traj.token_ids[:end], traj.action_mask[:end], traj.turn_ids[:end]
        if traj.logprobs is not None:
            traj.logprobs = traj.logprobs[:end]
        if traj.versions is not None:
            traj.versions = traj.versions[:end]
        traj.split()
        traj.token_ids, traj.action_mask, traj.turn_ids = ids, [False] * len(ids), [-1] * len(ids)
        if traj.logprobs is not None:
            traj.logprobs = [0.0] * len(ids)
        if traj.versions is not None:
            traj.versions = [-1] * len(ids)
        return TokenView(ids, len(ids))

    def close(self) -> None:
        """Close the env, exactly once."""
        if not self._closed:
            self._closed = True
            self.client.close()

    def __enter__(self) -> RolloutHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise EpisodeError("the harness is closed")

    def opening_messages(self, prompt: str, info: dict[str, Any]) -> list[dict[str, Any]]:
        """The conversation a reset of ``(prompt, info)`` opens (``EpisodeChat.opening``)."""
        return self.defaults.for_episode(info, self.info.name).opening(prompt, info)

    def renderer_for(self, info: dict[str, Any]) -> ChatRenderer:
        """The renderer an episode reset with ``info`` uses (one per tool set)."""
        return self._renderers.with_tools(self.defaults.for_episode(info, self.info.name).tools)

    def observation_role_for(self, info: dict[str, Any]) -> str:
        """The role a step's observation is rendered in: its info's ``observation_role``, else the
        episode's; ``"user"`` (warned once) where the chat template refuses that role."""
        role = self.chat.role_for(info, self.info.name)
        if role == "user" or self.renderer.renders_role(role):
            return role
        if role not in self._unrendered_roles:
            self._unrendered_roles.add(role)
            warnings.warn(
                f"the chat template cannot render a {role!r} message after an answer: {self.info.name}'s "
                f"{role} observations are rendered as user messages",
                AgileRLWarning,
                stacklevel=2,
            )
        return "user"

    @property
    def system_prompt(self) -> str | None:
        """The current episode's system prompt."""
        return self.chat.system_prompt

    @property
    def observation_role(self) -> str:
        """The current episode's observation role (a step's info may override it for one turn)."""
        return self.chat.observation_role

    def _content(self, observation: Any) -> str | list[dict[str, Any]]:
        """A message's content for an observation without a processor: its text, or (for a chat
        endpoint that reads images) OpenAI content parts; an image for a text model is an error."""
        if self._image_parts:
            return image_parts(observation)
        return text_only(observation, self.info.name)

    def _append_turn(
        self,
        action_ids: list[int],
        logprobs: Sequence[float] | None,
        version: int | None,
        role: str,
        observation: str,
        tail: list[int] | None = None,
    ) -> None:
        """Append the completion, the template's turn close, the observation (or ``tail``: the
        rendered tool results) and the next opening."""
        traj = self.trajectory
        renderer = self.renderer
        if tail is None and self.vision is not None:
            where = f"{self.info.name}.step()"
            tail = self.vision.tail(renderer, role, observation, final=self._done, media=traj.media, where=where)
        elif tail is None:
            content = self._content(observation)
            if isinstance(content, str):
                tail = renderer.turn_tail_ids(role, content, final=self._done)
            else:
                tail = renderer.parts_tail_ids(role, content, final=self._done)
        if action_ids and action_ids[-1] == renderer.end_of_turn_id and tail and tail[0] == action_ids[-1]:
            tail = tail[1:]  # the model already closed its turn
        turn = self._turn - 1
        if logprobs is not None or traj.logprobs is not None:
            if traj.logprobs is None:
                traj.logprobs = [0.0] * len(traj.token_ids)
            traj.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(action_ids)
            traj.logprobs += [0.0] * len(tail)
        if version is not None or traj.versions is not None:
            if traj.versions is None:
                traj.versions = [-1] * len(traj.token_ids)
            traj.versions += [version if version is not None else -1] * len(action_ids)
            traj.versions += [-1] * len(tail)
        traj.token_ids += action_ids
        traj.token_ids += tail
        traj.action_mask += [True] * len(action_ids)
        traj.action_mask += [False] * len(tail)
        traj.turn_ids += [turn] * (len(action_ids) + len(tail))


def _add_components(totals: dict[str, Any], info: Any) -> None:
    """Sum a step's ``info["reward_components"]`` into the episode's (logged as reward/<name>)."""
    components = info.get("reward_components") if isinstance(info, dict) else None
    if isinstance(components, dict) and components:
        summed = totals.setdefault("reward_components", {})
        for name, value in components.items():
            if isinstance(value, (int, float)):
                summed[str(name)] = summed.get(str(name), 0.0) + float(value)
