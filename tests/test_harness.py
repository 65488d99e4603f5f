"""RolloutHarness against real chat templates: incremental ids equal one full render."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agilerl.errors import EpisodeError
from agilerl.rollout.harness import RolloutHarness


class GuessEnv:
    """The docs' example: guess a number between 1 and 10."""

    max_turns = 5

    def __init__(self) -> None:
        self.closed = 0

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(1, 10)
        return "Guess a number between 1 and 10.", {"target": self.target}

    def step(self, action):
        guess = int(action.strip()) if action.strip().isdigit() else -1
        if guess == self.target:
            return "Correct!", 1.0, True, False, {}
        return ("Too high!" if guess > self.target else "Too low!"), 0.0, False, False, {}

    def close(self):
        self.closed += 1


class ToolEnv(GuessEnv):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "guess",
                "description": "Guess a number",
                "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
            },
        }
    ]


def _full_render(tokenizer, messages, **kwargs):
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("template", ["chatml", "llama3"])
@pytest.mark.parametrize("system_prompt", [None, "Answer with one number."])
def test_incremental_ids_equal_one_full_render(template, system_prompt, request):
    tokenizer = request.getfixturevalue(f"{template}_tokenizer")
    env = GuessEnv()
    harness = RolloutHarness.local(env, tokenizer, max_turns=5, system_prompt=system_prompt)
    prompt, info = harness.reset(seed=3)
    target = info["target"]
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": "Guess a number between 1 and 10."}
    ]
    assert list(prompt) == _full_render(tokenizer, messages, add_generation_prompt=True)
    guesses = [g for g in ["10", "1", "7", "3", str(target)] if g != str(target)][:3] + [str(target)]
    for guess in guesses:
        completion = tokenizer.encode(guess, add_special_tokens=False) + [harness.renderer.end_of_turn_id]
        prompt, reward, terminated, truncated, _ = harness.step(completion)
        obs = "Correct!" if guess == str(target) else ("Too high!" if int(guess) > target else "Too low!")
        messages += [{"role": "assistant", "content": guess}, {"role": "user", "content": obs}]
        if not terminated:
            assert list(prompt) == _full_render(tokenizer, messages, add_generation_prompt=True)
    assert terminated and reward == 1.0
    assert harness.trajectory.token_ids == _full_render(tokenizer, messages)


def test_tools_and_template_kwargs_reach_the_template(chatml_tokenizer):
    harness = RolloutHarness.local(ToolEnv(), chatml_tokenizer, chat_template_kwargs={"unused_flag": True})
    prompt, _ = harness.reset(seed=0)
    text = chatml_tokenizer.decode(list(prompt))
    assert "# Tools" in text and '"name": "guess"' in text
    harness.step("5")
    messages = [{"role": "user", "content": "Guess a number between 1 and 10."}]
    expected = chatml_tokenizer.apply_chat_template(messages, tools=ToolEnv.tools, tokenize=False)
    assert chatml_tokenizer.decode(harness.trajectory.token_ids).startswith(expected)


def test_chat_template_kwargs_are_passed(chatml_tokenizer):
    template = chatml_tokenizer.chat_template.replace(
        "{%- for message in messages %}", "{%- if greeting %}{{- greeting }}{%- endif %}{%- for message in messages %}", 1
    )
    tokenizer = chatml_tokenizer.__class__(
        tokenizer_object=chatml_tokenizer.backend_tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=template,
    )
    harness = RolloutHarness.local(GuessEnv(), tokenizer, chat_template_kwargs={"greeting": "HELLO"})
    prompt, _ = harness.reset(seed=0)
    assert tokenizer.decode(list(prompt)).startswith("HELLO<|im_start|>user")


def test_masks_turn_ids_and_rewards(chatml_tokenizer):
    harness = RolloutHarness.local(GuessEnv(), chatml_tokenizer, max_turns=5)
    prompt, info = harness.reset(seed=1)
    prompt_len = len(prompt)
    wrong = "1" if info["target"] != 1 else "2"
    completions = []
    for guess in (wrong, str(info["target"])):
        ids = chatml_tokenizer.encode(guess, add_special_tokens=False) + [harness.renderer.end_of_turn_id]
        completions.append(ids)
        harness.step(ids)
    traj = harness.trajectory
    assert traj.rewards == [0.0, 1.0] and traj.terminated and not traj.truncated
    assert len(traj.token_ids) == len(traj.action_mask) == len(traj.turn_ids)
    assert traj.turn_ids[:prompt_len] == [-1] * prompt_len
    generated = [t for t, m in zip(traj.token_ids, traj.action_mask) if m]
    assert generated == completions[0] + completions[1]
    # each turn's generated tokens carry that turn's index, and start right after a generation prompt
    first_action = traj.action_mask.index(True)
    assert first_action == prompt_len
    assert {traj.turn_ids[i] for i, m in enumerate(traj.action_mask) if m} == {0, 1}


def test_turn_budget_truncates_and_env_may_end_earlier(chatml_tokenizer):
    harness = RolloutHarness.local(GuessEnv(), chatml_tokenizer, max_turns=2)
    _, info = harness.reset(seed=5)
    wrong = "1" if info["target"] != 1 else "2"
    *_, terminated, truncated, _ = harness.step(wrong)
    assert (terminated, truncated) == (False, False)
    *_, terminated, truncated, _ = harness.step(wrong)
    assert (terminated, truncated) == (False, True)
    assert harness.done and harness.trajectory.truncated
    with pytest.raises(EpisodeError, match="call reset"):
        harness.step(wrong)
    harness.reset(seed=5)
    *_, terminated, truncated, _ = harness.step(str(info["target"]))
    assert (terminated, truncated) == (True, False)


def test_text_completion_equals_token_completion(chatml_tokenizer):
    a = RolloutHarness.local(GuessEnv(), chatml_tokenizer, max_turns=3)
    b = RolloutHarness.local(GuessEnv(), chatml_tokenizer, max_turns=3)
    a.reset(seed=2)
    b.reset(seed=2)
    a.step("4")
    b.step(chatml_tokenizer.encode("4", add_special_tokens=False))
    assert a.trajectory.token_ids == b.trajectory.token_ids


def test_logprobs_align_with_tokens(chatml_tokenizer):
    harness = RolloutHarness.local(GuessEnv(), chatml_tokenizer, max_turns=2)
    harness.reset(seed=0)
    ids = chatml_tokenizer.encode("4", add_special_tokens=False) + [harness.renderer.end_of_turn_id]
    harness.step(ids, logprobs=[-0.5] * len(ids))
    traj = harness.trajectory
    assert len(traj.logprobs) == len(traj.token_ids)
    assert [lp for lp, m in zip(traj.logprobs, traj.action_mask) if m] == [-0.5] * len(ids)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.action_mask) if not m)


def test_close_closes_the_env_exactly_once(chatml_tokenizer):
    env = GuessEnv()
    with RolloutHarness.local(env, chatml_tokenizer) as harness:
        harness.reset(seed=0)
        harness.close()
    assert env.closed == 1
    with pytest.raises(EpisodeError, match="closed"):
        harness.reset(seed=0)


def test_step_before_reset_is_a_clear_error(chatml_tokenizer):
    harness = RolloutHarness.local(GuessEnv(), chatml_tokenizer)
    with pytest.raises(EpisodeError, match="reset"):
        harness.step("5")


def test_env_messages_replace_the_default_prompt(chatml_tokenizer):
    class TemplatedEnv(GuessEnv):
        def reset(self, seed=None):
            prompt, info = super().reset(seed)
            info["messages"] = [
                {"role": "system", "content": "You are a guesser."},
                {"role": "user", "content": prompt},
            ]
            return prompt, info

    harness = RolloutHarness.local(TemplatedEnv(), chatml_tokenizer)
    prompt, _ = harness.reset(seed=0)
    assert chatml_tokenizer.decode(list(prompt)).startswith("<|im_start|>system\nYou are a guesser.")


def test_max_turns_defaults_to_the_envs_own(chatml_tokenizer):
    assert RolloutHarness.local(GuessEnv(), chatml_tokenizer).max_turns == 5

    class NoBudget:
        def reset(self, seed=None):
            return "", {}

        def step(self, action):
            return "", 0.0, True, False, {}

    with pytest.raises(ValueError, match="NoBudget declares no usable max_turns"):
        RolloutHarness.local(NoBudget(), chatml_tokenizer)


def test_an_empty_final_observation_adds_no_turn(chatml_tokenizer):
    class SingleTurn:
        def reset(self, seed=None):
            return "What is 2+2?", {}

        def step(self, action):
            return "", float(action.strip() == "4"), True, False, {}

    harness = RolloutHarness.local(SingleTurn(), chatml_tokenizer, max_turns=1)
    harness.reset()
    harness.step("4")
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
    assert harness.trajectory.token_ids == _full_render(chatml_tokenizer, messages)
    assert harness.trajectory.rewards == [1.0]


def test_harnesses_can_share_one_renderer_and_its_prompt_cache(chatml_tokenizer):
    first = RolloutHarness.local(GuessEnv(), chatml_tokenizer, max_turns=3)
    second = RolloutHarness.local(GuessEnv(), chatml_tokenizer, max_turns=3, renderer=first.renderer)
    assert second.renderer is first.renderer
    a, _ = first.reset(seed=0)
    b, _ = second.reset(seed=0)
    assert list(a) == list(b)
    first.step("4")  # one trajectory growing must not touch the other's (cached) prompt
    assert len(second.trajectory.token_ids) == len(b)
    assert first.renderer.prompt_ids([{"role": "user", "content": "x"}]) == _full_render(
        chatml_tokenizer, [{"role": "user", "content": "x"}], add_generation_prompt=True
    )


_DEFAULT_SYSTEM_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.parametrize("template", ["chatml", "llama3", "default_system"])
@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Guess a number."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Guess a number."}],
        [{"role": "user", "content": "  padded \n"}],  # Llama 3 trims content: no shortcut there
        [{"role": "system", "content": ""}, {"role": "user", "content": "multi\nline\n\n"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    ],
)
def test_opening_ids_equal_one_full_render(template, messages, request):
    """New prompts skip the template render: the renderer fills learned text around the contents."""
    base = request.getfixturevalue("llama3_tokenizer" if template == "llama3" else "chatml_tokenizer")
    tokenizer = base
    if template == "default_system":
        tokenizer = base.__class__(
            tokenizer_object=base.backend_tokenizer,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            chat_template=_DEFAULT_SYSTEM_TEMPLATE,
        )
    renderer = RolloutHarness.local(GuessEnv(), tokenizer).renderer
    expected = _full_render(tokenizer, messages, add_generation_prompt=True)
    assert renderer.prompt_ids(messages) == expected
    assert renderer.prompt_ids(messages) == expected  # memoised


def test_decoded_actions_match_the_tokenizers_decode(chatml_tokenizer):
    harness = RolloutHarness.local(GuessEnv(), chatml_tokenizer)
    harness.reset(seed=0)
    ids = chatml_tokenizer.encode(" Seven, or 7?  ", add_special_tokens=False)
    action = harness.prepare_step([*ids, harness.renderer.end_of_turn_id])
    assert action == chatml_tokenizer.decode(ids, skip_special_tokens=True) == " Seven, or 7?  "


def test_warming_many_turns_at_once_gives_the_same_ids(chatml_tokenizer):
    """The collector tokenizes a batch's answers in one call; nothing may change but the speed."""
    from agilerl.chat import ChatRenderer

    long_text = "a long board " * 60  # over the memo's size limit: warmed once, used once
    observations = [("user", "Too high!"), ("user", "Too low!"), ("user", long_text), ("user", "")]
    openings = [
        [{"role": "user", "content": "Guess a number."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Guess 2."}],
    ]
    plain, warmed = ChatRenderer(chatml_tokenizer), ChatRenderer(chatml_tokenizer)
    warmed.warm(openings=openings, observations=observations)
    for role, text in observations:
        for final in (False, True):
            assert warmed.turn_tail_ids(role, text, final=final) == plain.turn_tail_ids(role, text, final=final)
    for messages in openings:
        assert warmed.prompt_ids(messages) == plain.prompt_ids(messages)
    full = _full_render(
        chatml_tokenizer,
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": long_text}],
        add_generation_prompt=True,
    )
    head = _full_render(chatml_tokenizer, [{"role": "user", "content": "x"}], add_generation_prompt=True)
    y = chatml_tokenizer.encode("y", add_special_tokens=False)
    warmed.warm(observations=[("user", long_text), ("user", "other")])
    assert head + y + warmed.turn_tail_ids("user", long_text, final=False) == full


class _BrokenEnv:
    """Answers ``reset`` or ``step`` with whatever the test puts in ``replies``."""

    max_turns = 3

    def __init__(self, replies):
        self.replies = replies

    def reset(self, seed=None):
        return self.replies.get("reset", ("Guess.", {}))

    def step(self, action):
        return self.replies["step"]

    def state(self):
        return {"turn": 1}


@pytest.mark.parametrize(
    ("replies", "message"),
    [
        ({"reset": "Guess."}, r"_BrokenEnv\.reset\(\) must return a 2-tuple \(prompt, info\), got str"),
        ({"reset": (1, {})}, r"_BrokenEnv\.reset\(\) prompt must be str, got int"),
        ({"step": ("Too low!", 0.0, False, False)}, r"step\(\) must return a 5-tuple \(observation, reward, "
         r"terminated, truncated, info\), got a 4-tuple"),
        ({"step": (7, 0.0, False, False, {})}, r"step\(\) observation must be str, got int"),
        ({"step": ("x", float("nan"), False, False, {})}, r"reward must be finite, got nan"),
        ({"step": ("x", True, False, False, {})}, r"reward must be a number \(int or float\), got True"),
        ({"step": ("x", "1", False, False, {})}, r"reward must be a number \(int or float\), got '1'"),
    ],
)
def test_an_env_breaking_the_protocol_gets_an_error_naming_the_call_and_the_value(replies, message, chatml_tokenizer):
    from agilerl.errors import EnvProtocolError

    harness = RolloutHarness.local(_BrokenEnv(replies), chatml_tokenizer)
    with pytest.raises(EnvProtocolError, match=message):
        harness.reset(seed=0)
        harness.step("5")


def test_in_process_client_reports_the_envs_state_and_closes_once(chatml_tokenizer):
    closed = []
    env = _BrokenEnv({"step": ("Too low!", 1, False, False, {})})
    env.close = lambda: closed.append(True)
    harness = RolloutHarness.local(env, chatml_tokenizer)
    harness.reset(seed=0)
    assert harness.client.state() == {"turn": 1}
    assert harness.client.step("5") == ("Too low!", 1.0, False, False, {})  # normalised types
    harness.close()
    harness.close()
    assert closed == [True]


def test_a_prompt_is_a_view_that_later_turns_do_not_change(chatml_tokenizer):
    from agilerl.rollout.harness import TokenView

    harness = RolloutHarness.local(GuessEnv(), chatml_tokenizer)
    prompt, _ = harness.reset(seed=0)
    assert isinstance(prompt, TokenView)
    frozen = prompt.tolist()
    harness.step("5")  # appends to the same list the view reads
    assert len(prompt) == len(frozen) and prompt == frozen and prompt == tuple(frozen)
    assert prompt[0] == frozen[0] and prompt[-1] == frozen[-1] and prompt[1:3] == frozen[1:3]
    with pytest.raises(IndexError):
        prompt[len(frozen)]  # the next turn's tokens exist in the list, but not in this view
    with pytest.raises(IndexError):
        prompt[-len(frozen) - 1]
    assert repr(prompt) == f"TokenView({frozen!r})" and prompt != "not ids"


def test_max_turns_below_one_is_refused(chatml_tokenizer):
    with pytest.raises(ValueError, match="max_turns must be an int >= 1, got 0"):
        RolloutHarness(GuessEnv(), chatml_tokenizer, max_turns=0)


# Like Qwen3's template, in brief: a finished answer after the last user message gets an (empty)
# think block, earlier answers lose their thinking, and the generation prompt opens no think block
# unless ``think`` is false.
_HISTORY_REWRITING_TEMPLATE = (
    "{%- set last = namespace(user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set last.user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{%- set answer = m.content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- if loop.index0 > last.user %}{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + answer }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + answer }}{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if think is defined and not think %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


# DeepSeek-R1 in brief: earlier answers keep only what follows their thinking.
_DROPS_OLD_THINKING_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{%- set answer = m.content if loop.last else m.content.split('</think>')[-1] %}"
    "{{- '<|im_start|>assistant\n' + answer + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def _with_template(base, template):
    return base.__class__(
        tokenizer_object=base.backend_tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        chat_template=template,
    )


@pytest.mark.parametrize(
    ("template", "kwargs"),
    [(_HISTORY_REWRITING_TEMPLATE, {}), (_HISTORY_REWRITING_TEMPLATE, {"think": False}),
     (_DROPS_OLD_THINKING_TEMPLATE, {})],
    ids=["qwen3-like", "qwen3-like-no-think", "r1-like"],
)
def test_a_template_that_rewrites_history_gives_append_only_trajectories(template, kwargs, chatml_tokenizer):
    """Qwen3- and R1-style templates drop old thinking: a full render never shows what the model
    saw, so the trajectory is each prompt plus what the model generated, thinking kept."""
    tokenizer = _with_template(chatml_tokenizer, template)
    with pytest.warns(UserWarning, match="appended turn by turn"):
        harness = RolloutHarness.local(GuessEnv(), tokenizer, chat_template_kwargs=kwargs)
    assert not harness.renderer.full_render_identical
    prompt, _ = harness.reset(seed=3)
    opening = [{"role": "user", "content": "Guess a number between 1 and 10."}]
    assert list(prompt) == _full_render(tokenizer, opening, add_generation_prompt=True, **kwargs)
    for guess in ("10", "1"):
        completion = tokenizer.encode(f"<think>\nmaybe {guess}\n</think>\n\n{guess}", add_special_tokens=False)
        completion.append(harness.renderer.end_of_turn_id)
        before = list(prompt)
        prompt, *_ = harness.step(completion)
        obs = "Too low!"  # GuessEnv reads the whole answer, thinking and all, as no number
        tail = f"\n<|im_start|>user\n{obs}<|im_end|>\n{harness.renderer.generation_prompt}"
        assert list(prompt) == before + completion + tokenizer.encode(tail, add_special_tokens=False)
        assert f"maybe {guess}" in tokenizer.decode(list(prompt))  # the model's thinking stays
    mask = harness.trajectory.action_mask
    generated = [t for t, m in zip(harness.trajectory.token_ids, mask) if m]
    assert tokenizer.decode(generated).count("<think>") == 2


def test_a_template_that_hides_assistant_content_is_refused(chatml_tokenizer):
    from agilerl.errors import ChatTemplateError

    hiding = _DEFAULT_SYSTEM_TEMPLATE.replace("message.content + '<|im_end|>", "'[hidden]<|im_end|>")
    with pytest.raises(ChatTemplateError, match="does not render an assistant message's content as given"):
        RolloutHarness.local(GuessEnv(), _with_template(chatml_tokenizer, hiding))


_ALTERNATE = (
    "{%- for m in messages %}{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
)
# Gemma 2 in brief: no system role, roles alternate, content trimmed, the assistant is "model".
_NO_SYSTEM_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- raise_exception('System role not supported') }}{%- endif %}"
    + _ALTERNATE
    + "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{- '<|im_start|>' + role + '\\n' + m['content'] | trim + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>model\\n' }}{%- endif %}"
)
# Early Mistral in brief: roles alternate, [INST] around user turns, no generation prompt at all.
_INST_TEMPLATE = (
    _ALTERNATE
    + "{%- if m['role'] == 'user' %}{{- '[INST] ' + m['content'] + ' [/INST]' }}"
    "{%- elif m['role'] == 'assistant' %}{{- m['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported!') }}{%- endif %}{%- endfor %}"
)


# Mistral v0.3 in brief: the system message goes into the newest user turn; roles alternate.
_SYSTEM_LAST_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
    "{%- set turns = messages[1:] %}{%- else %}{%- set turns = messages %}{%- endif %}"
    "{%- for m in turns %}{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{%- if m['role'] == 'user' %}{%- if loop.last and system is defined %}"
    "{{- '[INST] ' + system + '\\n\\n' + m['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + m['content'] + '[/INST]' }}{%- endif %}"
    "{%- else %}{{- ' ' + m['content'] + eos_token }}{%- endif %}{%- endfor %}"
)
# Phi-3 in brief: a conversation that does not end in a generation prompt ends with a trailer.
_TRAILER_TEMPLATE = _DEFAULT_SYSTEM_TEMPLATE.replace(
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- else %}{{- '<|endoftext|>' }}{%- endif %}",
)


@pytest.mark.parametrize(
    "template", [_NO_SYSTEM_TEMPLATE, _INST_TEMPLATE, _TRAILER_TEMPLATE], ids=["no-system", "inst", "trailer"]
)
def test_templates_that_insist_on_alternating_roles_or_end_with_a_trailer_render_incrementally(
    template, chatml_tokenizer
):
    """The trajectory is the full render of the conversation (less a trailer the template adds after
    the last turn, which belongs to no turn)."""
    assert template.count("<|endoftext|>") == (1 if template is _TRAILER_TEMPLATE else 0)
    tokenizer = _with_template(chatml_tokenizer, template)
    harness = RolloutHarness.local(GuessEnv(), tokenizer)
    assert harness.renderer.full_render_identical
    prompt, info = harness.reset(seed=3)
    messages = [{"role": "user", "content": "Guess a number between 1 and 10."}]
    assert list(prompt) == _full_render(tokenizer, messages, add_generation_prompt=True)
    for guess in ("10", "1", str(info["target"])):
        completion = tokenizer.encode(guess, add_special_tokens=False) + [harness.renderer.end_of_turn_id]
        prompt, _, terminated, *_ = harness.step(completion)
        obs = "Correct!" if int(guess) == info["target"] else ("Too high!" if int(guess) > info["target"] else "Too low!")
        messages += [{"role": "assistant", "content": guess}, {"role": "user", "content": obs}]
        if terminated:
            break
        assert list(prompt) == _full_render(tokenizer, messages, add_generation_prompt=True)
    trailer = tokenizer.encode("<|endoftext|>", add_special_tokens=False) if template is _TRAILER_TEMPLATE else []
    assert harness.trajectory.token_ids + trailer == _full_render(tokenizer, messages)


def test_a_system_prompt_the_template_refuses_is_a_clear_error(chatml_tokenizer):
    from agilerl.errors import ChatTemplateError

    harness = RolloutHarness.local(
        GuessEnv(), _with_template(chatml_tokenizer, _NO_SYSTEM_TEMPLATE), system_prompt="Be brief."
    )
    with pytest.raises(ChatTemplateError, match=r"refused a conversation of roles \[system, user\]: System role"):
        harness.reset(seed=0)


def test_a_new_observation_costs_one_render_when_the_template_alters_content(llama3_tokenizer, monkeypatch):
    """Llama 3 trims content, so each new observation is rendered; the conversation it follows
    is rendered once, not per observation."""
    from agilerl.chat import ChatRenderer

    renderer = ChatRenderer(llama3_tokenizer)
    renderer.message_text("user", "first")  # learns the role
    renders = []
    original = renderer.render_text
    monkeypatch.setattr(renderer, "render_text", lambda *a, **k: renders.append(1) or original(*a, **k))
    texts = [renderer.message_text("user", f" obs {i} ") for i in range(5)]
    assert len(renders) == 5
    assert texts[0] == "<|start_header_id|>user<|end_header_id|>\n\nobs 0<|eot_id|>"


def test_a_tokenizer_without_a_chat_template_is_a_clear_error(chatml_tokenizer):
    from agilerl.errors import ChatTemplateError

    base_model_tokenizer = _with_template(chatml_tokenizer, None)
    with pytest.raises(ChatTemplateError, match=r"no chat template \(is it a base model's\?\)"):
        RolloutHarness.local(GuessEnv(), base_model_tokenizer)


def test_a_system_prompt_a_template_moves_forward_stays_where_the_model_saw_it(chatml_tokenizer):
    """Mistral v0.3 puts the system prompt into the newest user turn (and a space before each
    answer that its generation prompt lacks): the conversation is built append-only, so each
    turn's prompt holds the system prompt where the model was shown it."""
    tokenizer = _with_template(chatml_tokenizer, _SYSTEM_LAST_TEMPLATE)
    with pytest.warns(UserWarning, match="appended turn by turn"):
        harness = RolloutHarness.local(GuessEnv(), tokenizer, system_prompt="Be brief.")
    prompt, _ = harness.reset(seed=0)
    opening = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Guess a number between 1 and 10."}]
    assert list(prompt) == _full_render(tokenizer, opening, add_generation_prompt=True)
    before = list(prompt)
    prompt, *_ = harness.step("10")
    text = tokenizer.decode(list(prompt)[len(before):])
    assert text == "10<|im_end|>[INST] Too high![/INST]"  # the answer as generated; no system prompt moved here


class PerTaskEnv:
    """An env that frames each task itself: its system prompt and tools come with reset's info,
    and a tool's result is marked for the ``tool`` role in step's info."""

    max_turns = 3
    TOOLS = [{"type": "function", "function": {"name": f"lookup_{i}", "parameters": {"type": "object"}}} for i in range(2)]

    def reset(self, seed=None):
        task = (seed or 0) % 2
        info = {"system_prompt": f"You solve task {task}.", "tools": [self.TOOLS[task]], "task": task}
        return f"Task {task}: call the tool, then answer.", info

    def step(self, action):
        if "call" in action:
            return f"result of {action}", 0.0, False, False, {"observation_role": "tool"}
        return "Checked.", 1.0, True, False, {}


def _per_task_messages(seed, tool_role=None):
    """A PerTaskEnv episode's opening (and, given the tool result's role, its whole conversation)
    after the replies "call it" and "42"; and its tools."""
    task = seed % 2
    messages = [
        {"role": "system", "content": f"You solve task {task}."},
        {"role": "user", "content": f"Task {task}: call the tool, then answer."},
    ]
    if tool_role:
        messages += [
            {"role": "assistant", "content": "call it"},
            {"role": tool_role, "content": "result of call it"},
            {"role": "assistant", "content": "42"},
            {"role": "user", "content": "Checked."},
        ]
    return messages, [PerTaskEnv.TOOLS[task]]


@pytest.mark.parametrize("seed", [0, 1])
def test_reset_info_gives_each_episode_its_system_prompt_and_tools_and_a_tool_result_its_role(seed, chatml_tokenizer):
    harness = RolloutHarness.local(PerTaskEnv(), chatml_tokenizer)
    for episode_seed in (1 - seed, seed):  # the other task first: nothing of it may remain
        prompt, _ = harness.reset(seed=episode_seed)
    opening, tools = _per_task_messages(seed)
    assert list(prompt) == _full_render(chatml_tokenizer, opening, tools=tools, add_generation_prompt=True)
    harness.step("call it")
    harness.step("42")
    messages, _ = _per_task_messages(seed, tool_role="tool")
    assert harness.trajectory.token_ids == _full_render(chatml_tokenizer, messages, tools=tools)
    assert harness.system_prompt == f"You solve task {seed}." and harness.observation_role == "user"


def test_the_collector_frames_episodes_as_the_harness_does(chatml_tokenizer):
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import Generation

    def reply(prompt):
        text = "42" if "result of" in chatml_tokenizer.decode(list(prompt)) else "call it"
        return Generation(chatml_tokenizer.encode(text, add_special_tokens=False))

    class Scripted:
        def generate(self, prompts, params):
            return [reply(p) for p in prompts]

    # seed 2 draws one task of each framing
    with RolloutCollector(PerTaskEnv, chatml_tokenizer, batch_size=2, group_size=2, seed=2) as collector:
        batch = collector.collect(Scripted())
    seeds = set()
    for traj in (t for group in batch.groups for t in group):
        harness = RolloutHarness.local(PerTaskEnv(), chatml_tokenizer)
        harness.reset(seed=traj.seed)
        harness.step("call it")
        harness.step("42")
        assert traj.token_ids == harness.trajectory.token_ids and traj.rewards == [0.0, 1.0]
        seeds.add(traj.seed % 2)
    assert seeds == {0, 1}  # both framings met in one batch


def test_env_check_shows_the_episodes_framing_as_the_harness_renders_it(tmp_path, capsys, monkeypatch):
    from agilerl.cli.main import main

    (tmp_path / "per_task.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom test_harness import PerTaskEnv\n" % str(Path(__file__).parent)
    )
    monkeypatch.chdir(tmp_path)
    assert main(["env", "check", "per_task.py:PerTaskEnv", "--seed", "1", "--actions", "call it,42"]) == 0
    text = capsys.readouterr().out
    assert "[tools] lookup_1\n[system] You solve task 1.\n[user] Task 1: call the tool, then answer." in text
    assert "[assistant] call it\n[tool] result of call it\n[assistant] 42\n[user] Checked." in text


def test_a_template_without_a_tool_role_renders_the_tool_result_as_the_user(chatml_tokenizer):
    no_tool_role = chatml_tokenizer.chat_template.replace(
        "{%- for message in messages %}",
        "{%- for message in messages %}{%- if message['role'] == 'tool' %}{{- raise_exception('no tool role') }}{%- endif %}",
    )
    tokenizer = _with_template(chatml_tokenizer, no_tool_role)
    harness = RolloutHarness.local(PerTaskEnv(), tokenizer)
    harness.reset(seed=0)
    with pytest.warns(UserWarning, match="cannot render a 'tool' message"):
        harness.step("call it")
    harness.step("42")
    messages, tools = _per_task_messages(0, tool_role="user")
    assert harness.trajectory.token_ids == _full_render(tokenizer, messages, tools=tools)


def test_a_served_env_frames_its_episodes_as_in_process(chatml_tokenizer):
    """The framing travels in reset's and step's info, which RemoteEnvClient asks the server for."""
    from agilerl.remote.hosting import resolve_env

    url, server = resolve_env(PerTaskEnv)
    with server, RolloutHarness(url, chatml_tokenizer, max_turns=3) as harness:
        harness.reset(seed=1)
        harness.step("call it")
        harness.step("42")
        messages, tools = _per_task_messages(1, tool_role="tool")
        assert harness.trajectory.token_ids == _full_render(chatml_tokenizer, messages, tools=tools)


@pytest.mark.parametrize(
    ("info", "message"),
    [
        ({"tools": {"name": "x"}}, r"PerTaskEnv.reset\(\) info\['tools'\] must be a list of JSON-schema dicts"),
        ({"system_prompt": 3}, r"info\['system_prompt'\] must be a str"),
        ({"observation_role": ""}, r"info\['observation_role'\] must be a non-empty str"),
    ],
)
def test_a_framing_of_the_wrong_type_is_an_error_naming_the_key_and_value(info, message, chatml_tokenizer):
    from agilerl.errors import EnvProtocolError

    env = PerTaskEnv()
    env.reset = lambda seed=None: ("hi", info)
    with pytest.raises(EnvProtocolError, match=message):
        RolloutHarness.local(env, chatml_tokenizer).reset(seed=0)
