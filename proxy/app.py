"""The Flask app factory: config, services, guards, error handlers, routes."""
from __future__ import annotations

import logging

from flask import Flask

from proxy import config as config_mod
from proxy import guards, routes
from proxy.services import Services


class ProxyApp(Flask):
    """Flask, with its check for async views and hooks made once per function: Flask asks
    inspect.iscoroutinefunction for the view and every hook, 7 times a request."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sync: dict = {}

    def ensure_sync(self, func):
        if func not in self._sync:
            self._sync[func] = super().ensure_sync(func)
        return self._sync[func]


def create_app(config: dict | None = None, *, services: Services | None = None) -> Flask:
    app = ProxyApp("kimi-proxy")
    cfg = config if config is not None else config_mod.load()
    app.config.update(cfg)
    app.config["MAX_CONTENT_LENGTH"] = cfg["MAX_BODY_BYTES"]
    (services or Services(app.config)).init_app(app)
    guards.init_app(app, routes.request_dialect)  # request id, Host/Origin, API key, errors
    app.register_blueprint(routes.bp)
    logging.getLogger("kimi.proxy").setLevel(logging.INFO)
    return app
