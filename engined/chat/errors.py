"""Typed errors of the text layer. The server maps ChatInputError to HTTP 400."""


class ChatInputError(ValueError):
    """The caller's messages, tools or token ids cannot be rendered or decoded."""


class UnsupportedTokenizer(ValueError):
    """The GGUF describes a tokenizer this engine does not build."""
