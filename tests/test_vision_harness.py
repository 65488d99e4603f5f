"""The harness with a vision model's processor: training ids are each family's own expansion on
every turn, placeholders typed by the env are escaped, one sampled by the model ends the episode
and is still trained, both size limits hold, and a long image episode stays bounded."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agilerl.errors import EnvProtocolError
from agilerl.images import ImageLimits
from agilerl.rollout.harness import RolloutHarness
from agilerl.generation.media import BatchMedia, attach_processor, limit_images
from agilerl.rollout.vision import ESCAPE, VisionTurns
from agilerl.train.batch import collate_trajectories
from agilerl.train.logprobs import policy_logprobs
from tests.vision_models import FAMILIES, REAL_TEMPLATES, AlbumEnv, qwen2_vl_processor, square, tiny_model, with_real_template


def _full_render(processor: Any, harness: RolloutHarness, messages: list[dict[str, Any]], images: list[Any]) -> Any:
    """The processor's own tokenization of the whole conversation, rendered in one go, and (as
    ``engine_ids``) the same text tokenized without the expansion: what vLLM takes."""
    text = harness.renderer.render_text(messages, add_generation_prompt=True)
    out = processor(text=[text], images=[[i.pil() for i in images]], add_special_tokens=False, return_tensors="pt")
    out["engine_ids"] = processor.tokenizer.encode(text, add_special_tokens=False)
    return out


def _content(observation: Any) -> Any:
    if isinstance(observation, str):
        return observation
    return [*({"type": "image"} for _ in observation.images), {"type": "text", "text": observation.text}]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_training_ids_are_the_families_own_expansion_on_every_turn(family: str) -> None:
    processor = FAMILIES[family]()
    env = AlbumEnv()
    harness = RolloutHarness.local(env, processor)
    prompt, _ = harness.reset(seed=0)
    opening, opening_engine_ids = prompt, None
    first = AlbumEnv().reset(0)[0]
    from agilerl.images import observation_from

    shown = observation_from(first, "AlbumEnv.reset()")
    messages = [{"role": "user", "content": _content(shown)}]
    images = list(shown.images)
    for answer in ["a red square", "green and blue", "three"]:
        expected = _full_render(processor, harness, messages, images)
        assert list(prompt) == expected["input_ids"][0].tolist()
        assert prompt.media.engine_ids(prompt) == expected["engine_ids"]  # one template placeholder an image
        opening_engine_ids = opening_engine_ids or expected["engine_ids"]
        ours = prompt.media.tensors()
        for key, value in ours.items():
            assert torch.equal(value, expected[key]), key
        prompt, *_ = harness.step(answer)
        replay = AlbumEnv()
        replay.turn = env.turn - 1
        shown = observation_from(replay.step("")[0], "AlbumEnv.step()")
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": _content(shown)}]
        images += [] if isinstance(shown, str) else list(shown.images)
    expected = _full_render(processor, harness, messages, images)
    assert list(prompt) == expected["input_ids"][0].tolist()  # four images, earlier ones in place
    assert prompt.media.engine_ids(prompt) == expected["engine_ids"]
    assert len(expected["engine_ids"]) < len(prompt)
    assert opening.media.engine_ids(opening) == opening_engine_ids  # an earlier prompt: its own turns only
    assert prompt.media.num_images == 4


def _parts(observation: Any) -> list[dict[str, Any]]:
    """A message's content as multimodal templates and processors take it: a list of parts."""
    if isinstance(observation, str):
        return [{"type": "text", "text": observation}]
    return [*({"type": "image"} for _ in observation.images), {"type": "text", "text": observation.text}]


@pytest.mark.parametrize("name", sorted(REAL_TEMPLATES))
def test_real_vlm_chat_templates_render_token_exact_on_every_turn(name: str) -> None:
    """Each model's own chat template, on its family's processor: the harness's ids on every turn
    are the processor's tokenization of the conversation rendered whole (content as parts, as
    these templates take it: SmolVLM's and LLaVA-1.5's render a plain string as nothing), and the
    ids vLLM takes are that text unexpanded. Qwen2-VL's ``add_vision_id`` numbers the pictures
    across the whole conversation. Where the generation prompt lacks the space the template puts
    before an answer (SmolVLM's "Assistant:", LLaVA's "ASSISTANT:"), the model generates it."""
    from agilerl.images import observation_from

    processor, kwargs = with_real_template(name)
    env = AlbumEnv()
    harness = RolloutHarness.local(env, processor, chat_template_kwargs=kwargs or None)
    prompt, _ = harness.reset(seed=0)
    shown = observation_from(AlbumEnv().reset(0)[0], "AlbumEnv.reset()")
    messages, images = [{"role": "user", "content": _parts(shown)}], list(shown.images)
    for answer in ["a red square", "green and blue", "three", None]:
        text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        expected = processor(text=[text], images=[[i.pil() for i in images]], add_special_tokens=False)["input_ids"][0]
        assert list(prompt) == list(expected), processor.tokenizer.decode(list(prompt))
        assert prompt.media.engine_ids(prompt) == processor.tokenizer.encode(text, add_special_tokens=False)
        if answer is None:
            break
        generated = answer if harness.renderer.full_render_identical else " " + answer
        prompt, *_ = harness.step(generated)
        replay = AlbumEnv()
        replay.turn = env.turn - 1
        shown = observation_from(replay.step("")[0], "AlbumEnv.step()")
        messages += [{"role": "assistant", "content": _parts(answer)}, {"role": "user", "content": _parts(shown)}]
        images += [] if isinstance(shown, str) else list(shown.images)
    assert prompt.media.num_images == 4
    if kwargs.get("add_vision_id"):
        assert "Picture 4: " in processor.tokenizer.decode(list(prompt))


def test_a_placeholder_the_env_types_is_escaped_and_forges_no_image() -> None:
    processor = qwen2_vl_processor()
    typed = " <|image_pad|><|vision_start|> <image>"
    harness = RolloutHarness.local(AlbumEnv(text=typed), processor)
    prompt, _ = harness.reset(seed=0)
    harness.step("a")
    prompt, *_ = harness.step("b")  # a text turn carrying the typed placeholder
    turns = VisionTurns.of(processor)
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    expected_pads = sum(int((chunk["image_grid_thw"].prod(dim=1) // 4).sum()) for chunk in prompt.media.chunks)
    assert list(prompt).count(image_pad) == expected_pads  # only the real images' slots
    text = processor.tokenizer.decode(list(prompt))
    assert f"<{ESCAPE}|image_pad|>" in text and f"<{ESCAPE}|vision_start|>" in text
    assert turns.escaped("<|image_pad|>") == f"<{ESCAPE}|image_pad|>"


def test_a_placeholder_the_model_samples_ends_the_episode_and_is_trained() -> None:
    from agilerl.train.tiny_model import build_tiny_vlm

    processor = qwen2_vl_processor()
    tokenizer = attach_processor(processor)
    model = build_tiny_vlm(processor)
    harness = RolloutHarness.local(AlbumEnv(), tokenizer)
    harness.reset(seed=0)
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    sampled = tokenizer.encode("a", add_special_tokens=False) + [image_pad] + tokenizer.encode("bc", add_special_tokens=False)
    _, reward, terminated, truncated, _ = harness.step(sampled, logprobs=[-1.0] * len(sampled))
    traj = harness.trajectory
    assert harness.done and truncated and not terminated
    assert traj.info["ended_by"] == "sampled image placeholder"
    generated = [t for t, m in zip(traj.token_ids, traj.action_mask) if m]
    assert generated == sampled[: sampled.index(image_pad) + 1]  # cut after it, kept for training
    batch = collate_trajectories([traj], tokenizer.pad_token_id)
    assert batch.media is not None and batch.media.sampled.sum() == 1
    scores = policy_logprobs(model, batch.input_ids, batch.attention_mask, mask=batch.action_mask, media=batch.media)
    at = traj.token_ids.index(image_pad, len(traj.token_ids) - len(generated) - 8)
    assert batch.action_mask[0, at] and scores[0, at] < 0  # scored: the model read it as padding


def test_images_past_either_limit_fail_naming_the_env_the_size_and_the_setting() -> None:
    tokenizer = attach_processor(qwen2_vl_processor())
    limit_images(tokenizer, ImageLimits(max_pixels=1000, max_images=16))
    harness = RolloutHarness.local(AlbumEnv(), tokenizer)
    harness.reset(seed=0)  # 960 pixels: within
    with pytest.raises(EnvProtocolError, match=r"AlbumEnv\.step\(\): an image of 64x64 = 4,096 pixels is over max_image_pixels=1,000"):
        harness.step("a"), harness.step("b"), harness.step("c")
    limit_images(tokenizer, ImageLimits(max_images=2))
    harness = RolloutHarness.local(AlbumEnv(), tokenizer)
    harness.reset(seed=0)
    with pytest.raises(EnvProtocolError, match=r"AlbumEnv\.step\(\): the conversation would hold 3 images, over max_images=2"):
        harness.step("a")


def test_a_text_model_shown_an_image_says_it_needs_a_vision_model(chatml_tokenizer: Any) -> None:
    with pytest.raises(EnvProtocolError, match="AlbumEnv returned an image observation, but the model has no image processor"):
        RolloutHarness.local(AlbumEnv(), chatml_tokenizer).reset(seed=0)


class FlipbookEnv:
    """A small picture every turn, for as long as the episode lasts."""

    max_turns = 200

    def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        return {"text": "frame 0", "image": square((0, 0, 0), 16, 16)}, {}

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return {"text": "next", "image": square((7, 7, 7), 16, 16)}, 0.0, False, False, {}


def test_a_200_turn_image_episode_holds_each_image_once_and_the_cap_bounds_it() -> None:
    processor = qwen2_vl_processor()
    tokenizer = attach_processor(processor)
    limit_images(tokenizer, ImageLimits(max_images=201))
    harness = RolloutHarness.local(FlipbookEnv(), tokenizer)
    harness.reset(seed=0)
    one_image = harness.trajectory.media.chunks[0]["pixel_values"].numel()
    calls = 0
    real_call = type(processor).__call__

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real_call(self, *args, **kwargs)

    type(processor).__call__ = counted
    try:
        for _ in range(200):
            harness.step("ok")
    finally:
        type(processor).__call__ = real_call
    media = harness.trajectory.media
    assert harness.done and calls == 200  # one processor call per turn: no turn re-processes the past
    assert media.num_images == 201 and sum(c["pixel_values"].numel() for c in media.chunks) == 201 * one_image
    limit_images(tokenizer, ImageLimits())  # the default cap: 16 images per conversation
    harness = RolloutHarness.local(FlipbookEnv(), tokenizer)
    harness.reset(seed=0)
    with pytest.raises(EnvProtocolError, match="over max_images=16"):
        for _ in range(200):
            harness.step("ok")
    assert harness.trajectory.media.num_images == 16


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_samplers_logprobs_are_the_trainers_with_images_in_every_turn(family: str) -> None:
    """Each family's tiny model samples three turns of pictures of three sizes (two in one turn)
    and the trainer's recompute, fed the batch's images, scores them as the sampler did."""
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.generation.policy import SamplingParams, TransformersPolicy

    processor = FAMILIES[family]()
    model, tokenizer = tiny_model(family, processor).eval(), attach_processor(processor)
    with RolloutCollector(AlbumEnv, tokenizer, batch_size=2, group_size=2, max_turns=3, seed=0,
                          sampling=SamplingParams(max_new_tokens=5)) as collector:
        batch = collector.collect(TransformersPolicy(model, tokenizer))
    trajectories = batch.trajectories
    # a random model may sample a placeholder, which ends its episode early (and is still scored)
    assert all(t.media is not None for t in trajectories) and max(t.media.num_images for t in trajectories) >= 3
    tensors = collate_trajectories(trajectories, tokenizer.pad_token_id)
    assert isinstance(tensors.media, BatchMedia)
    with torch.no_grad():
        scores = policy_logprobs(model, tensors.input_ids, tensors.attention_mask, mask=tensors.action_mask, media=tensors.media)
    mask = tensors.action_mask
    assert torch.allclose(scores[mask], tensors.old_logprobs[mask], atol=1e-4)


def test_a_chat_endpoint_is_sent_each_picture_as_an_image_url_part_beside_its_text() -> None:
    """Without a processor, a policy behind a chat endpoint (``MessageTokenizer``) gets image
    observations as OpenAI content parts: the endpoint's processor reads the pictures."""
    from agilerl.images import EnvImage
    from agilerl.generation.openai_policy import MessageTokenizer

    tokenizer = MessageTokenizer()
    harness = RolloutHarness.local(AlbumEnv(), tokenizer, max_turns=3)
    prompt, _ = harness.reset(seed=0)
    prompt, *_ = harness.step("a red square")
    messages, _ = tokenizer.messages(prompt)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    parts = messages[2]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"] and parts[2]["text"] == "And these?"
    shown = [EnvImage.from_data_url(p["image_url"]["url"]) for p in parts[:2]]
    expected = [EnvImage.from_array(square((20, 200, 20), 24, 40)), EnvImage.from_array(square((20, 20, 200)))]
    assert [i.checksum() for i in shown] == [i.checksum() for i in expected]
    prompt, *_ = harness.step("green and blue")
    assert tokenizer.messages(prompt)[0][-1] == {"role": "user", "content": "Now in words."}


def test_an_engine_expanding_the_images_unlike_the_processor_is_an_error_naming_both() -> None:
    """vLLM reports the prompt ids it expanded; they must be the harness's (the ids the trainer
    scores), else the run stops rather than train on samples of another context."""
    from agilerl.errors import InvalidArgument
    from agilerl.generation.vllm.policy import check_expansion

    prompt, _ = RolloutHarness.local(AlbumEnv(), FAMILIES["idefics3"]()).reset(seed=0)
    ours = list(prompt)
    check_expansion(prompt, ours, "vllm serve at http://r")  # the same: nothing to say
    check_expansion(ours, ours[:3], "vllm serve at http://r")  # a text prompt (no media): not checked
    again = ours[:6] + ours[5:]  # one id more, as when vLLM expanded an expanded placeholder again
    with pytest.raises(InvalidArgument, match=rf"vllm serve at http://r expanded the prompt's images to {len(ours) + 1} ids "
                       rf"where the model's processor made {len(ours)} \(first difference at id 6\).*transformers backend"):
        check_expansion(prompt, again, "vllm serve at http://r")
