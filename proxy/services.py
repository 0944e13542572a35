"""What a running proxy holds: the upstream client, metrics, state and the recorder.

Created once by `create_app` (`init_app`), reachable as `app.extensions["kimi"]`.
The request-level hooks the handler calls live here too: `prepare` (previous_response_id),
`finish` (ledger write at a completed turn), `after_response` / `done` (store, log,
metrics, cassette).
"""
from __future__ import annotations

import logging
import time

from proxy import canonical as c
from proxy.errors import NotFound
from proxy.metrics import Metrics
from proxy.recorder import Recorder
from proxy.state import open_state
from proxy.upstream import Upstream

log = logging.getLogger("kimi.proxy")


class Services:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.metrics = Metrics()
        self.upstream = Upstream(cfg["UPSTREAM"], timeout_s=cfg["UPSTREAM_TIMEOUT_S"],
                                 api_key=cfg.get("UPSTREAM_API_KEY"))
        self.reasoning, self.responses = open_state(cfg, self.metrics)
        self.recorder = Recorder(cfg["RECORD"], cfg) if cfg.get("RECORD") else None
        self._served: dict = {}
        self._next_ask = 0.0

    def served_info(self) -> dict:
        """The upstream's model id and context: asked once, or again 30 s after it gave none."""
        if "id" not in self._served and time.monotonic() >= self._next_ask:
            ask = getattr(self.upstream, "served_info", None)
            self._served = ask() if ask else {}
            self._next_ask = time.monotonic() + 30.0
        return self._served

    def served_model(self) -> str | None:
        return self.served_info().get("id")

    def fit_max_tokens(self, payload: dict, body_bytes: int) -> dict:
        """Lower max_tokens to the context left after the prompt.

        Agents ask for 32k completion tokens whatever the model; an engine with an 8k context
        would refuse the request outright. The prompt is counted by the upstream's /tokenize
        only when the request could overflow: a prompt has fewer tokens than body bytes."""
        context = self.served_info().get("max_model_len")
        key = next((k for k in ("max_tokens", "max_completion_tokens") if payload.get(k)), None)
        if not context or key is None or body_bytes + payload[key] + 256 <= context:
            return payload
        count = self.upstream.tokenize(payload["messages"], payload.get("tools"), payload.get("model"))
        room = context - count if count is not None else 0
        if room <= 0 or payload[key] <= room:
            return payload  # unknown count or no room: the upstream's own answer stands
        log.info("max_tokens %d lowered to %d: prompt %d of %d context tokens",
                 payload[key], room, count, context)
        return {**payload, key: room}

    def init_app(self, app) -> None:
        app.extensions["kimi"] = self

    def close(self) -> None:
        self.upstream.close()
        self.reasoning.close()
        self.responses.close()
        if self.recorder:
            self.recorder.close()

    # -- request hooks -----------------------------------------------------------------
    def prepare(self, dialect: str, req: c.Request, body: dict, turn) -> c.Request:
        if dialect != "openai_responses":
            return req
        from proxy.dialects.openai_responses import parse_input
        turn.extra["echo"] = {k: body[k] for k in ("tools", "tool_choice", "parallel_tool_calls", "instructions",
                                                   "metadata", "previous_response_id", "store") if k in body}
        turn.extra["tools_by_name"] = {t.name: t for t in req.tools}
        items = body.get("input")
        items = [{"type": "message", "role": "user", "content": items}] if isinstance(items, str) else list(items or [])
        turn.extra["input_items"] = items
        if req.previous_response_id:
            history = self.responses.history(req.previous_response_id)
            if history is None:
                raise NotFound(f"previous response {req.previous_response_id!r} was not found "
                               "(it expired, was deleted, or was created with store:false)",
                               param="previous_response_id")
            lead = [m for m in req.messages[:1] if m.role == "system" and body.get("instructions")]
            req = req.replace(messages=(*lead, *parse_input(history), *req.messages[len(lead):]))
        return req

    def finish(self, dialect, req, turn, response: c.Response, ledger_id: str, policy) -> None:
        self.reasoning.record(ledger_id, response, self.cfg["REASONING_FIELD"])

    def after_response(self, dialect: str, req: c.Request, turn, body: dict) -> None:
        if dialect == "openai_responses" and req.store is not False:
            self._store(req, turn, body)

    def _store(self, req, turn, body: dict) -> None:
        self.responses.put(turn.id, input_items=turn.extra.get("input_items", []), output_items=body["output"],
                           previous_id=req.previous_response_id, response=body)

    def done(self, ex) -> None:
        final = ex.turn.extra.get("final") if ex.turn is not None else None
        if final is not None and ex.req is not None and ex.req.store is not False:
            self._store(ex.req, ex.turn, final)
        self.log_request(ex)
        if self.recorder:
            self.recorder.submit(ex)

    def log_request(self, ex) -> None:
        ms = (time.monotonic() - ex.started) * 1000
        policy = ex.policy
        self.metrics.requests.labels(ex.route, policy.preset if policy else "-", str(ex.status)).inc()
        log.info("%s %s -> %s client=%s (%s) status=%s %.1f ms", ex.request_id, ex.route,
                 policy.preset if policy else "-", policy.client if policy else "-",
                 policy.reason if policy else "-", ex.status, ms)
