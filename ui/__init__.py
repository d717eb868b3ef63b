"""The Gradio app. Only this package and app.py import gradio."""

from ui.app import build_app

__all__ = ["build_app"]
