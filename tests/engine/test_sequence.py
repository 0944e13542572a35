"""Sequence text: stop strings held back and trimmed, reasoning at the start."""


from engined.engine.sequence import StopMatcher


def test_stop_string_split_across_tokens_is_trimmed():
    matcher = StopMatcher(("STOP",))
    released = [matcher.push(piece) for piece in ("Hello S", "T", "OP and more")]
    assert released == [("Hello ", False), ("", False), ("", True)]


def test_held_back_text_is_released_when_it_is_not_a_stop():
    matcher = StopMatcher(("</end>",))
    assert matcher.push("a <") == ("a ", False)
    assert matcher.push("b>") == ("<b>", False)
    assert matcher.push("x</en") == ("x", False)
    assert matcher.flush() == "</en"


def test_a_prompt_that_opens_think_starts_the_output_as_reasoning(default_gguf, kimi_cache):
    from engined.chat import load_text
    from engined.chat.output import ContentDelta, OutputParser, ReasoningDelta
    from engined.serving.generate import new_output_parser

    _, chat = load_text(default_gguf)  # the GGUF's Jinja format: the hermes parser
    assert type(new_output_parser(chat, False, "")) is OutputParser

    def split(prompt):
        parser = new_output_parser(chat, False, prompt)
        deltas = parser.feed("Let me see.</think>Paris.") + parser.finish()
        return ("".join(d.text for d in deltas if isinstance(d, ReasoningDelta)),
                "".join(d.text for d in deltas if isinstance(d, ContentDelta)))

    assert split("<|im_start|>assistant\n<think>\n") == ("Let me see.", "Paris.")
    assert split("<|im_start|>assistant\n") == ("", "Let me see.</think>Paris.")

