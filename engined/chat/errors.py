"""Typed errors of the text layer. The server maps ChatInputError to HTTP 400."""


class ChatInputError(ValueError):
    """The caller's messages, tools or token ids cannot be rendered or decoded."""


class UnsupportedTokenizer(ValueError):
    """The GGUF describes a tokenizer this engine does not build."""


class PromptTooLong(ChatInputError):
    """The text has more tokens than the caller's limit; encoding stopped once that was sure."""

    def __init__(self, num_tokens: int, limit: int):
        super().__init__(f"the text has at least {num_tokens} tokens, more than {limit}")
        self.num_tokens = num_tokens  # a floor: the count when encoding stopped
        self.limit = limit
