"""The core: the text-env protocol and everything that moves text and tokens."""
