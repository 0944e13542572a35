"""A context overflow from any upstream keeps OpenAI's code, and on the Anthropic dialect leads
with the API's own wording, "prompt is too long: N tokens > M maximum", which Claude Code reads
to compact its history."""
import pytest

from proxy.errors import ContextTooLong, anthropic_body, openai_body
from proxy.upstream.status import status_error

ENGINE = ("This model's maximum context length is 8192 tokens. However, you requested 9100 tokens "
          "(8900 in the messages, 200 in the completion). Please reduce the length of the messages "
          "or completion.")
VLLM = ("This model's maximum context length is 8192 tokens. However, your prompt contains at least "
        "8193 input tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=8193)")
CASES = [  # (upstream error body, tokens, maximum)
    ({"message": ENGINE, "code": "context_length_exceeded"}, 9100, 8192),
    ({"message": VLLM, "type": "BadRequestError", "param": "input_tokens", "code": 400}, 8193, 8192),  # vLLM 0.32
    ({"message": "This model's maximum context length is 8192 tokens. However, you requested 32000 output "
                 "tokens and your prompt contains at least 5001 input tokens, for a total of at least 37001 "
                 "tokens. Please reduce the length of the input prompt or the number of requested output "
                 "tokens. (parameter=input_tokens, value=5001)",
      "type": "BadRequestError", "param": "input_tokens", "code": 400}, 37001, 8192),     # vLLM, with max_tokens
    ({"message": "You passed 9000 input tokens and requested 100 output tokens. However, the model's context "
                 "length is only 8192 tokens, resulting in a maximum input length of 8092 tokens. Please "
                 "reduce the length of the input prompt. (parameter=input_tokens, value=9000)",
      "type": "BadRequestError", "param": "input_tokens", "code": 400}, 9100, 8192),      # vLLM's renderer
    ({"object": "error", "message": "The input (40000 tokens) is longer than the model's context length "
                                    "(32768 tokens).", "type": "BadRequest", "param": None, "code": 400},
     40000, 32768),                                                                     # SGLang, flat
    ({"object": "error", "message": "Requested token count exceeds the model's maximum context length of "
                                    "32768 tokens. You requested a total of 40192 tokens: 40000 tokens from "
                                    "the input messages and 192 tokens for the completion. Please reduce the "
                                    "number of tokens in the input messages or the completion to fit within "
                                    "the limit.", "type": "BadRequest", "param": None, "code": 400},
     40192, 32768),                                                                     # SGLang, max_tokens
    ({"code": 400, "message": "request (12000 tokens) exceeds the available context size (4096 tokens), "
                              "try increasing it",
      "type": "exceed_context_size_error", "n_prompt_tokens": 12000, "n_ctx": 4096}, 12000, 4096),  # llama.cpp
]


def _body(error: dict) -> dict:
    return error if error.get("object") == "error" else {"error": error}  # SGLang's body is the error


@pytest.mark.parametrize("error,tokens,maximum", CASES)
def test_overflow_counts_come_through_in_both_dialects(error, tokens, maximum):
    err = status_error(400, _body(error), context=None)
    assert isinstance(err, ContextTooLong) and (err.tokens, err.maximum) == (tokens, maximum)
    assert err.status == 400
    message = anthropic_body(err)["error"]["message"]
    assert message.startswith(f"prompt is too long: {tokens} tokens > {maximum} maximum. ")
    assert "--max-context 65536" in message
    body = openai_body(err)["error"]
    assert body["code"] == "context_length_exceeded" and not body["message"].startswith("prompt is too long")


def test_vllm_refusing_max_tokens_alone_is_an_overflow_that_names_the_context():
    """vLLM checks max_tokens before it counts the prompt: the agent's 32000 against an 8192
    context. The overflow's code and hint, and the context it names, are kept."""
    error = {"message": "max_tokens=32000 cannot be greater than max_model_len=8192. Please request fewer "
                        "output tokens. (parameter=max_tokens, value=32000)",
             "type": "BadRequestError", "param": "max_tokens", "code": 400}
    err = status_error(400, {"error": error})
    assert isinstance(err, ContextTooLong) and (err.tokens, err.maximum) == (None, 8192)
    body = openai_body(err)["error"]
    assert body["code"] == "context_length_exceeded" and "8192 tokens" in body["message"]
    assert "--max-context 65536" in body["message"]


def test_other_refusals_stay_plain_invalid_requests_with_their_own_message():
    """SGLang's flat body is read for its message too; a refusal that is no overflow stays one."""
    for error in ({"object": "error", "message": "Invalid tool_choice", "type": "BadRequest", "param": None,
                   "code": 400},
                  {"error": {"message": "[{'type': 'missing', 'loc': ('body', 'messages')}]",
                             "type": "BadRequestError", "param": None, "code": 400}}):  # vLLM, a bad body
        err = status_error(400, error)
        assert not isinstance(err, ContextTooLong) and err.type == "invalid_request_error"
        assert err.message == "upstream returned 400: " + (error.get("error") or error)["message"]


def test_an_overflow_without_counts_keeps_the_plain_message():
    err = status_error(400, {"error": {"message": "too long", "code": "context_length_exceeded"}})
    assert isinstance(err, ContextTooLong) and err.tokens is None
    assert anthropic_body(err)["error"]["message"].startswith("upstream returned 400: too long")


def test_the_served_context_stands_in_for_an_unnamed_maximum():
    err = status_error(400, {"error": {"message": "your messages resulted in 9000 tokens",
                                       "code": "context_length_exceeded"}}, context=8192)
    assert anthropic_body(err)["error"]["message"].startswith("prompt is too long: 9000 tokens > 8192 maximum")


@pytest.mark.parametrize("stream", [False, True])
def test_a_first_turn_that_does_not_fit_says_what_to_serve_a_later_one_asks_to_compact(tmp_path, stream):
    """A first turn cannot be compacted: Claude Code prints our message, which names the model
    and context to serve. After a reply, the API's wording lets Claude Code compact."""
    from proxy.app import create_app
    from tests.support.proxy_fakes import FakeUpstream, Reply, proxy_config
    fake = FakeUpstream()
    fake.max_model_len = 8192
    first = [{"role": "user", "content": "hi"}]
    later = first + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    with fake.serve() as url:
        client = create_app(proxy_config(url, tmp_path)).test_client()
        for messages, compact in ((first, False), (later, True)):
            fake.script = [Reply(status=400, error_code="context_length_exceeded", error_message=ENGINE)]
            resp = client.post("/v1/messages", json={"model": "m", "max_tokens": 64, "stream": stream,
                                                      "messages": messages})
            assert resp.status_code == 400
            message = resp.get_json()["error"]["message"]
            assert message.startswith("prompt is too long: 9100 tokens > 8192 maximum. ") is compact, message
            assert "Kimi-Linear" in message and "--max-context 65536" in message
