"""The Flask app factory: config, services, guards, error handlers, routes."""
from __future__ import annotations

import logging

from flask import Flask

from proxy import config as config_mod
from proxy import guards, routes
from proxy.services import Services


def create_app(config: dict | None = None, *, services: Services | None = None) -> Flask:
    app = Flask("kimi-proxy")
    cfg = config if config is not None else config_mod.load()
    app.config.update(cfg)
    app.config["MAX_CONTENT_LENGTH"] = cfg["MAX_BODY_BYTES"]
    (services or Services(app.config)).init_app(app)
    guards.init_app(app, routes.request_dialect)  # request id, Host/Origin, API key, errors
    app.register_blueprint(routes.bp)
    logging.getLogger("kimi.proxy").setLevel(logging.INFO)
    return app
