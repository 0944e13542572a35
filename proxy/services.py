"""What a running proxy holds: the upstream client, metrics, state and the recorder.

Created once by `create_app` (`init_app`), reachable as `app.extensions["kimi"]`.
The request-level hooks the handler calls live here too: `record_turn` (ledger write at
a completed turn) and `done` (the request log, metrics, the cassette).
"""
from __future__ import annotations

import logging
import time

from proxy import canonical as c
from proxy.cassettes.record import Recorder
from proxy.metrics import Metrics
from proxy.state import open_state
from proxy.upstream.client import Upstream
from proxy.upstream.context import fit

log = logging.getLogger("kimi.proxy")


class Services:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.metrics = Metrics()
        self.upstream = Upstream(cfg["UPSTREAM"], timeout_s=cfg["UPSTREAM_TIMEOUT_S"],
                                 api_key=cfg.get("UPSTREAM_API_KEY"),
                                 engine_uid=cfg.get("ENGINE_USER"))
        self.reasoning, self.responses = open_state(cfg, self.metrics)
        self.recorder = Recorder(cfg["RECORD"], cfg) if cfg.get("RECORD") else None
        self._served: dict = {}
        self._next_ask = 0.0

    def served_info(self) -> dict:
        """The upstream's model id and context: asked once, or again 30 s after it gave none."""
        if "id" not in self._served and time.monotonic() >= self._next_ask:
            self._served = self.upstream.served_info()
            self._next_ask = time.monotonic() + 30.0
        return self._served

    def served_model(self) -> str | None:
        return self.served_info().get("id")

    def sendable(self, req: c.Request) -> c.Request:
        """The request as the upstream can take it: for one that reads text only, each image
        is the line that says so (an image would be a 400 on that turn and every later one)."""
        if self.served_info().get("text_only"):
            return req.replace(messages=c.without_images(req.messages))
        return req

    def fit_max_tokens(self, payload: dict, body_bytes: int, truncate: bool = False) -> dict:
        """Lower max_tokens to the context left after the prompt; a prompt that cannot fit is
        refused here (proxy.upstream.context), or with truncate loses turns from its middle. Agents
        ask for 32k completion tokens whatever the model; an upstream with an 8k context would
        refuse the request outright."""
        context = self.served_info().get("max_model_len") or self.upstream.max_model_len
        return fit(self.upstream, payload, body_bytes, context, truncate)

    def init_app(self, app) -> None:
        app.extensions["kimi"] = self

    def close(self) -> None:
        self.upstream.close()
        self.reasoning.close()
        self.responses.close()
        if self.recorder:
            self.recorder.close()

    # -- request hooks -----------------------------------------------------------------
    def record_turn(self, ledger_id: str, response: c.Response, conversation, owner: str) -> None:
        """A completed turn's reasoning and calls go to the ledger, for the client's next turn,
        under the conversation's key (a callable: the ledger writer hashes it) and its owner."""
        self.reasoning.record(ledger_id, response, self.cfg["REASONING_FIELD"], conversation, owner)

    def done(self, ctx) -> None:
        self.log_request(ctx)
        if self.recorder:
            self.recorder.submit(ctx)

    def log_request(self, ctx) -> None:
        ms = (time.monotonic() - ctx.started) * 1000
        policy = ctx.policy
        self.metrics.requests.labels(ctx.route, policy.preset if policy else "-", str(ctx.status)).inc()
        log.info("%s %s -> %s client=%s (%s) status=%s %.1f ms", ctx.request_id, ctx.route,
                 policy.preset if policy else "-", policy.client if policy else "-",
                 policy.reason if policy else "-", ctx.status, ms)
