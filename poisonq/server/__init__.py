"""The HTTP surface: JSON API, web UI and Prometheus metrics (``poisonq serve``).

Needs the ``server`` extra (FastAPI, uvicorn, Jinja2, prometheus-client).
"""

from poisonq.server.app import create_app

__all__ = ["create_app"]
