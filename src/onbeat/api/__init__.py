"""onbeat's REST API (FastAPI): ``create_app(onbeat_app)``, and ``serve_api`` for the node."""

from onbeat.api.app import create_app
from onbeat.api.server import serve_api

__all__ = ["create_app", "serve_api"]
