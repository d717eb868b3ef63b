"""Figures: pure functions from an engine snapshot (and the last step's events) to plotly figures
and small HTML pieces. Only this package imports plotly."""

from viz.kv_heatmap import kv_figure
from viz.panels import event_log_markdown, metrics_html, sequences_html
from viz.pool_figure import pool_figure
from viz.requests_panel import requests_html

__all__ = ["event_log_markdown", "kv_figure", "metrics_html", "pool_figure", "requests_html",
           "sequences_html"]
