"""Shared fixtures: the tiny offline tokenizers and model every test uses."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def chatml_tokenizer():
    from agilerl.builtins.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer("chatml")


@pytest.fixture(scope="session")
def llama3_tokenizer():
    from agilerl.builtins.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer("llama3")


@pytest.fixture(scope="session")
def tiny_model(chatml_tokenizer):
    from agilerl.builtins.tiny_model import build_tiny_model

    return build_tiny_model(chatml_tokenizer)
