"""ContextBudget: what can still fit the model's context, decided before any model work.

Text too long for the room left is recognised by its length alone: no token covers more
characters than the tokenizer's longest vocabulary entry, so text of more than ``room x longest``
characters cannot fit, whatever it tokenizes to. Such text is never tokenized (a 5 MB
observation costs a ``len()``), and a conversation that fills the context never reaches the policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["ContextBudget", "text_chars", "answer_chars"]


@dataclass(frozen=True)
class ContextBudget:
    """The model's context (``max_model_len`` tokens; None: unknown, nothing is checked) and the
    most characters one token can cover."""

    max_model_len: int | None
    chars_per_token: int = 1

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, max_model_len: int | None) -> ContextBudget:
        """The budget for ``tokenizer``'s vocabulary (its longest entry, special tokens included)."""
        if max_model_len is None:
            return cls(None)
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        return cls(max_model_len, max((len(t) for t in vocab), default=0) or 64)

    def cannot_fit(self, chars: int, used_tokens: int) -> bool:
        """True when ``chars`` characters of text cannot fit after ``used_tokens`` tokens."""
        if self.max_model_len is None:
            return False
        return chars > max(0, self.max_model_len - used_tokens) * self.chars_per_token

    def full(self, used_tokens: int) -> bool:
        """True when ``used_tokens`` leave no room for one generated token."""
        return self.max_model_len is not None and used_tokens >= self.max_model_len

    def too_long(self, chars: int) -> str:
        """Why an opening prompt of ``chars`` characters was refused."""
        return (
            f"the env's opening prompt is {chars:,} characters, more than "
            f"max_model_len={self.max_model_len} tokens can hold"
        )

    def no_room(self, tokens: int) -> str:
        """Why an opening prompt of ``tokens`` tokens was refused."""
        return (
            f"the opening prompt is {tokens:,} tokens: max_model_len={self.max_model_len} leaves "
            "no room to generate"
        )


def text_chars(texts: Iterable[Any]) -> int:
    """How many characters the given texts hold (a message's content may be a list of parts)."""
    total = 0
    for text in texts:
        if isinstance(text, str):
            total += len(text)
        elif isinstance(text, dict):
            total += text_chars(text.values())
        elif isinstance(text, (list, tuple)):
            total += text_chars(text)
    return total


def answer_chars(method: str, result: Any) -> int:
    """The characters of text an env's answer adds to the conversation (before tokenizing it)."""
    if method == "reset":
        prompt, info = result
        framing = info if isinstance(info, dict) else {}
        return text_chars([prompt, framing.get("messages"), framing.get("system_prompt")])
    return text_chars([result[0]])
