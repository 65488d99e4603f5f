"""The policy seam: token-id prompts in, completions (with their log-probs) out.

``Policy`` is one method, so the collector never knows what generates: ``TransformersPolicy``
wraps a Hugging Face model, ``ScriptedPolicy`` replies from a script (tests, benchmarks), and a
vLLM backend would implement the same ``generate``. Log-probs are those of the sampled tokens
under the temperature-scaled model, the distribution the losses recompute: the training algorithms
use them as old log-probs, so an on-policy ratio is exactly 1. Top-k and top-p shape what is
sampled but are left out of the log-probs (as TRL and verl do): including them would shift every
ratio by the truncated mass and move the clip range.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from agilerl.errors import InvalidArgument
from agilerl.generation.shared_prefix import shared_prefix_cache
from agilerl.generation.media import BatchMedia

if TYPE_CHECKING:
    import torch

__all__ = [
    "FinishReason",
    "SamplingParams",
    "Generation",
    "Policy",
    "ScriptedPolicy",
    "TransformersPolicy",
]

FinishReason = Literal["stop", "length", "context"]
"""``stop``: a stop token ended it (and is its last token); ``length``: ``max_new_tokens`` ran
out; ``context``: the model's context (``max_model_len``) is full, the conversation cannot go on."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature=0`` is greedy; ``top_k=0`` and ``top_p=1`` switch those off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InvalidArgument(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidArgument(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_new_tokens < 1:
            raise InvalidArgument(
                f"top_k must be >= 0 and max_new_tokens >= 1, got {self.top_k} and {self.max_new_tokens}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    """One completion: its token ids (ending with the stop token when it stopped), their log-probs,
    and the policy version of the weights that produced them (set by a ``VersionedPolicy``)."""

    token_ids: list[int]
    logprobs: list[float] | None = None
    finish_reason: FinishReason = "stop"
    version: int | None = None


@runtime_checkable
class Policy(Protocol):
    """Anything that turns a batch of prompts into one completion each, in order."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Complete every prompt; completions carry nothing after their stop token."""
        ...


@dataclass
class ScriptedPolicy:
    """Replies ``reply`` (or ``reply(prompt_ids)``) encoded, then the first stop token: no model.

    ``calls`` counts ``generate`` calls, so tests can check one batched call per turn.
    """

    tokenizer: Any
    reply: str | Callable[[Sequence[int]], str] = "42"
    calls: int = field(default=0, init=False)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        self.calls += 1
        stop = list(params.stop_token_ids[:1])
        out = []
        fixed = self._encode(self.reply) if isinstance(self.reply, str) else None
        for prompt in prompts:
            ids = fixed if fixed is not None else self._encode(self.reply(prompt))  # type: ignore[operator]
            ids = ids[: params.max_new_tokens]
            finish: FinishReason = "length" if len(ids) == params.max_new_tokens else "stop"
            ids = ids + stop if finish == "stop" else ids
            out.append(Generation(ids, None, finish))  # no model, so no log-probs
        return out

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


class TransformersPolicy:
    """A Hugging Face causal LM as a policy: one left-padded batched ``generate`` per call.

    A prompt that already fills ``max_model_len`` gets an empty completion with reason
    ``context``; the others get at most the room left in the context. Tokens are chosen here
    (:class:`_TokenChooser`), so the model's own sampling defaults never apply. Copies of one
    prompt in a batch (a GRPO group) share one prefill (:mod:`agilerl.generation.shared_prefix`).
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_model_len: int | None = None) -> None:
        self.model = model
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise InvalidArgument("the tokenizer has neither a pad token nor an eos token to pad prompts with")
        self.pad_id: int = pad
        self.eos_id: int | None = tokenizer.eos_token_id
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.max_model_len = max_model_len or getattr(text_config, "max_position_embeddings", None)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        import torch

        budgets = [self._budget(len(p), params.max_new_tokens) for p in prompts]
        out = [Generation([], [], "context") for _ in prompts]
        rows = [i for i, b in enumerate(budgets) if b > 0]
        if not rows:
            return out
        stops = list(dict.fromkeys([*params.stop_token_ids, *([self.eos_id] if self.eos_id is not None else [])]))
        device = next(self.model.parameters()).device
        width = max(len(prompts[i]) for i in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for r, i in enumerate(rows):
            n = len(prompts[i])
            input_ids[r, width - n :] = torch.tensor(list(prompts[i]), dtype=torch.long)
            attention[r, width - n :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        images = BatchMedia.for_prompts([getattr(prompts[i], "media", None) for i in rows], self.pad_id)
        chooser = _TokenChooser(params)
        was_training = self.model.training
        self.model.eval()  # no dropout: the log-probs must be those the tokens were sampled from
        try:
            with torch.no_grad():
                # all but each row's last prompt token, each distinct prompt once (a GRPO group's)
                if images is None:
                    cache, inputs = shared_prefix_cache(self.model, input_ids, attention, width - 1), {"input_ids": input_ids}
                else:  # a prefix cache would need the images' prefill: the rows run whole
                    cache, inputs = {}, images.to(device).model_inputs(input_ids)
                sequences = self.model.generate(
                    **inputs,
                    attention_mask=attention,
                    **cache,
                    logits_processor=[chooser],
                    max_new_tokens=max(budgets[i] for i in rows),
                    do_sample=False,  # the chooser has already picked: generate's argmax takes its pick
                    num_beams=1,
                    repetition_penalty=1.0,
                    eos_token_id=stops or None,
                    pad_token_id=self.pad_id,
                )
        finally:
            self.model.train(was_training)
        completions = sequences[:, width:].tolist()
        logprobs = chooser.chosen_logprobs().tolist()
        for r, i in enumerate(rows):
            out[i] = _cut(completions[r], logprobs[r], stops, budgets[i], params.max_new_tokens)
        return out

    def _budget(self, prompt_len: int, max_new_tokens: int) -> int:
        if self.max_model_len is None:
            return max_new_tokens
        return min(max_new_tokens, self.max_model_len - prompt_len)


def _cut(
    ids: list[int], logprobs: list[float], stops: list[int], budget: int, max_new_tokens: int
) -> Generation:
    """Keep a row's tokens up to and including its first stop token, within its own budget."""
    stop_set = set(stops)
    end = next((k + 1 for k, t in enumerate(ids[:budget]) if t in stop_set), None)
    if end is not None:
        return Generation(ids[:end], logprobs[:end], "stop")
    reason: FinishReason = "context" if budget < max_new_tokens else "length"
    return Generation(ids[:budget], logprobs[:budget], reason)


class _TokenChooser:
    """A logits processor that picks each next token and records its log-prob under the
    temperature-scaled scores (before top-k and top-p; see the module doc).

    It returns scores in which only its pick is finite, so ``generate`` runs greedy and its
    argmax takes the pick. Sampling is by inverse CDF, one uniform draw per row: on a CPU that
    costs about 2 ms a step for 16 rows over a 49k vocabulary, where ``torch.multinomial``
    (what ``generate`` samples with) costs about 30 ms.
    """

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self._logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import torch

        p = self.params
        scaled = scores.float() if p.greedy else scores.float() / p.temperature
        logprobs = scaled.log_softmax(dim=-1)
        if p.greedy:
            chosen = scaled.argmax(dim=-1, keepdim=True)
        else:
            truncated = p.top_k or p.top_p < 1.0
            cdf = (self._truncate(scaled).softmax(dim=-1) if truncated else logprobs.exp()).cumsum(dim=-1)
            # a draw in (0, total]: the first index whose cdf reaches it has probability > 0
            draw = (1.0 - torch.rand((cdf.shape[0], 1), device=cdf.device)) * cdf[:, -1:]
            chosen = torch.searchsorted(cdf, draw).clamp_(max=cdf.shape[-1] - 1)
        self._logprobs.append(logprobs.gather(-1, chosen).squeeze(-1))
        return torch.full_like(scores, float("-inf")).scatter_(-1, chosen, 0.0)

    def chosen_logprobs(self) -> torch.Tensor:
        """``[B, new_tokens]`` log-probs of the chosen tokens, on the CPU."""
        import torch

        return torch.stack(self._logprobs, dim=1).cpu()

    def _truncate(self, scores: torch.Tensor) -> torch.Tensor:
        """Top-k, then top-p, on temperature-scaled scores."""
        import torch

        p = self.params
        if p.top_k and p.top_k < scores.shape[-1]:
            kth = torch.topk(scores, p.top_k, dim=-1).values[..., -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
            probs = sorted_scores.softmax(dim=-1)
            drop = probs.cumsum(dim=-1) - probs > p.top_p  # mass before a token already exceeds top_p
            scores = scores.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
        return scores
