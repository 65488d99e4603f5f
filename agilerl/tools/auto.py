"""``tool_parser: auto``: the family a tokenizer's model writes calls in, from its special tokens,
then its chat template's text."""

from __future__ import annotations

from typing import Any

__all__ = ["detect_family"]

# (family, tokens that all must be in the vocabulary); the first match wins, so the more specific
# family comes first (Qwen3-Coder's template also uses <tool_call>).
_BY_TOKENS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harmony", ("<|channel|>", "<|message|>", "<|call|>")),
    ("deepseek", ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>")),
    ("mistral", ("[TOOL_CALLS]",)),
    ("gemma", ("<|tool_call>", "<tool_call|>")),
    ("granite", ("<|tool_call|>",)),
)
# (family, text in the chat template)
_BY_TEMPLATE: tuple[tuple[str, str], ...] = (
    ("harmony", "<|channel|>"),
    ("deepseek", "tool▁call▁begin"),
    ("mistral", "[TOOL_CALLS]"),
    ("gemma", "<|tool_call>"),
    ("granite", "<|tool_call|>"),
    ("qwen3_coder", "<function="),
    ("hermes", "<tool_call>"),
    ("llama3_json", "<|python_tag|>"),
    ("llama3_json", '"parameters"'),
)


def detect_family(tokenizer: Any) -> str | None:
    """The built-in family whose format this tokenizer's model writes, or None when neither its
    special tokens nor its chat template say."""
    try:
        vocab = set(tokenizer.get_added_vocab())
    except Exception:  # noqa: BLE001 - no added vocabulary: the template alone decides
        vocab = set()
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the tool-use one, else the default
        template = template.get("tool_use") or template.get("default") or ""
    template = template if isinstance(template, str) else ""
    for family, tokens in _BY_TOKENS:
        if all(token in vocab for token in tokens):
            return family
    if "<tool_call>" in vocab:
        return "qwen3_coder" if "<function=" in template else "hermes"
    for family, marker in _BY_TEMPLATE:
        if marker in template:
            return family
    if "<|python_tag|>" in vocab:
        return "llama3_json"
    return None
