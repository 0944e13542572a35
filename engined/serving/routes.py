"""The engine's HTTP application: a route table, errors rendered once, one log line and one
metrics count per request. Generating routes live in generate.py.
"""
import time
import traceback

from engined.serving import parse as api
from engined.serving import generate
from engined.chat.errors import ChatInputError
from engined.chat.messages import allowed_tools
from engined.errors import (EngineError, InternalError, InvalidRequest, MethodNotAllowed, NotFound,
                            Unavailable)
from engined.serving.event_stream import ClientGone
from engined.serving.generate import Served
from engined.serving.logs import LogSink, request_line
from engined.metrics import EngineMetrics
from engined.serving.bodies import DONE, sse

CLIENT_CLOSED = 499  # nginx's status for "the client went away first"


def models(served: Served, ex):
    return {"object": "list", "data": [{
        "id": served.model_id, "object": "model", "created": served.created,
        "owned_by": "kimi-local", "max_model_len": served.max_context,
        "input_modalities": ["text"]}]}  # read by kimi-proxy: images become text that says so


def health(served: Served, ex):
    if not served.engine.is_alive:
        raise Unavailable("the model thread is not running")
    return {"status": "ok", "model": served.model_id}


def tokenize(served: Served, ex):
    body = api.require_object(ex.json_body())
    if "messages" in body:
        add_generation_prompt, continue_final = api.parse_turn_end(body)
        tools, tool_choice = allowed_tools(body.get("tools"), body.get("tool_choice"))
        text = served.chat.render(body["messages"], tools, add_generation_prompt, tool_choice,
                                  continue_final)
        ids = generate.encode_prompt(served, text)
    elif isinstance(body.get("prompt"), str):
        add_special = api.get(body, "add_special_tokens", (bool,), "a boolean", True)
        ids = generate.encode_prompt(served, body["prompt"],
                                     add_bos=add_special and served.tokenizer.add_bos_token)
    else:
        raise InvalidRequest("give either prompt (a string) or messages", param="prompt")
    out = {"count": len(ids), "max_model_len": served.max_context, "tokens": ids}
    if api.get(body, "return_token_strs", (bool,), "a boolean", False):
        out["token_strs"] = [served.logprob_format().token(i)[0] for i in ids]
    return out


def detokenize(served: Served, ex):
    body = api.require_object(ex.json_body())
    ids = api.parse_token_ids(body, "tokens", served.tokenizer.vocab_size)
    return {"prompt": served.tokenizer.decode(ids)}


ROUTES = {
    ("POST", "/v1/chat/completions"): generate.chat_completions,
    ("POST", "/v1/completions"): generate.completions,
    ("POST", "/tokenize"): tokenize,
    ("POST", "/detokenize"): detokenize,
    ("GET", "/v1/models"): models,
    ("GET", "/health"): health,
}


class App:
    def __init__(self, served: Served, metrics: EngineMetrics, log: LogSink):
        self.served, self.metrics, self.log = served, metrics, log

    def handle(self, ex):
        route = f"{ex.method} {ex.path}"
        try:
            if (ex.method, ex.path) == ("GET", "/metrics"):
                ex.send_bytes(200, self.metrics.render(), self.metrics.content_type)
            else:
                body = self._route(ex)(self.served, ex)
                if body is not None:
                    ex.send_json(200, body)
        except ClientGone:
            ex.status = CLIENT_CLOSED
        except ChatInputError as exc:
            self._send_error(ex, InvalidRequest(str(exc)))
        except EngineError as exc:
            self._send_error(ex, exc)
        except Exception as exc:  # noqa: BLE001 - the edge: log it, answer 500, keep serving
            self.log.write(f"request_id={ex.request_id} internal error: "
                           f"{''.join(traceback.format_exception(exc)).strip()}")
            self._send_error(ex, InternalError(f"internal error: {exc}"))
        finally:
            seq = ex.stats.get("seq")
            if seq is not None and not seq.is_finished:
                seq.cancel()  # nobody reads it any more: free the model for others
            self._account(ex, route)

    def _route(self, ex):
        fn = ROUTES.get((ex.method, ex.path))
        if fn is not None:
            return fn
        if any(path == ex.path for _, path in ROUTES) or ex.path == "/metrics":
            raise MethodNotAllowed(f"{ex.method} is not allowed on {ex.path}")
        raise NotFound(f"no route {ex.method} {ex.path}")

    def _send_error(self, ex, exc: EngineError):
        try:
            if ex.is_streaming:  # headers are gone: the error becomes the last event
                ex.end_stream(sse(exc.body()) + DONE)
                ex.status = exc.status
            else:
                ex.send_json(exc.status, exc.body(), exc.headers())
                ex.finish_refused_request()
        except OSError:
            ex.status = CLIENT_CLOSED

    def _account(self, ex, route: str):
        status = ex.status or CLIENT_CLOSED
        known = (ex.method, ex.path) in ROUTES or ex.path == "/metrics"
        self.metrics.requests.labels(route if known else "other", str(status)).inc()
        if ex.path not in ("/health", "/metrics") or status >= 400:
            self.log.write(request_line(ex.request_id, route, status, ex.stats,
                                        time.monotonic() - ex.start_time))
