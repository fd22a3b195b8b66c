"""The Router's HTTP surface: an ASGI app served by uvicorn."""

from reachmesh.server.app import RouterApp, create_app

__all__ = ["RouterApp", "create_app"]
