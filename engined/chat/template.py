"""Render the GGUF's jinja chat template the way HF's apply_chat_template does.

Same environment: sandboxed, trim_blocks + lstrip_blocks, loopcontrols, a `generation`
block tag, `tojson` without HTML escaping, `raise_exception` and `strftime_now`, and
the special tokens (bos_token, eos_token, ...) as variables. Keys whose value is None
are dropped from messages, as HF does.

A template that reads `tools` gets the tools and tool calls natively; one that does not
(SmolLM2's) gets them as hermes text in its plain messages (hermes.py).
"""
from __future__ import annotations

import datetime
import json

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engined.chat import hermes
from engined.chat.errors import ChatInputError
from engined.chat.messages import (forced_tool, marked_final, normalize_messages, normalize_tools,
                                   open_final)

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
          " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# End-of-turn tokens llama.cpp also treats as end of generation, when the vocabulary has them.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>",
                      "<|end|>", "<|return|>")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training; it renders as its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def compile_template(source: str) -> tuple[jinja2.Template, bool]:
    """The compiled template and whether it reads `tools`."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        reads_tools = "tools" in jinja2.meta.find_undeclared_variables(env.parse(source))
        return env.from_string(source), reads_tools
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"the model's chat template does not compile: {exc}") from exc


def _native(messages: list[dict]) -> list[dict]:
    """Messages for a template with tool support: arguments as objects (vLLM does the same)."""
    out = []
    for message in messages:
        message = {k: v for k, v in message.items() if v is not None}
        for call in message.get("tool_calls", ()):
            try:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
            except ValueError:
                pass
        out.append(message)
    return out


class ChatFormat:
    def __init__(self, template: str | None, tokenizer):
        self.source = template or CHATML
        self._template, self.supports_tools = compile_template(self.source)
        self._special = {name: tokenizer.id_to_token(i) if i is not None else None
                         for name, i in (("bos_token", tokenizer.bos_id), ("eos_token", tokenizer.eos_id))}
        ends = {tokenizer.eos_id} | {tokenizer.token_to_id(t) for t in END_OF_TURN_TOKENS}
        self.stop_token_ids = frozenset(i for i in ends if i is not None and i in tokenizer.special_ids | {tokenizer.eos_id})
        self.stop_strings = tuple(tokenizer.id_to_token(i) for i in sorted(self.stop_token_ids))

    def output_parser(self, tools_enabled: bool, in_reasoning: bool = False):
        """The streaming parser for this format's output: hermes <tool_call> and <think>
        (engined/chat/output.py)."""
        from engined.chat.output import OutputParser
        return OutputParser(tools_enabled, in_reasoning)

    def tool_grammar(self, tools: list[dict], forced: str, is_parallel: bool):
        """The grammar of this format's tool calls (hermes <tool_call>, which output.py
        reads) -> (Lark source, lazy trigger or None); forced as messages.forced_tool."""
        from engined.grammar.tools import hermes_grammar
        return hermes_grammar(tools, forced, is_parallel)

    def render(self, messages: list[dict], tools: list[dict] | None = None,
               add_generation_prompt: bool = True, tool_choice=None,
               continue_final: bool = False) -> str:
        """The prompt text; continue_final: open at the end of the final message's text
        (messages.marked_final, open_final), with no generation prompt."""
        plain = normalize_messages(messages)
        plain = marked_final(plain) if continue_final else plain
        tools = normalize_tools(tools)
        forced = forced_tool(tool_choice, tools)
        if self.supports_tools:
            plain, tools = _native(plain), (tools if forced is not None else None)
        else:
            plain, tools = hermes.render_history(plain, tools, forced), None
        try:
            text = self._template.render(messages=plain, tools=tools,
                                         add_generation_prompt=add_generation_prompt and not continue_final,
                                         **self._special)
        except jinja2.TemplateError as exc:
            raise ChatInputError(f"the chat template rejected these messages: {exc}") from exc
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise ChatInputError(f"the chat template failed on these messages: {exc}") from exc
        return open_final(text) if continue_final else text
