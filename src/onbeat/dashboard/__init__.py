"""The web dashboard the node serves at ``/``: server-rendered pages (Jinja2), inline SVG charts
and one small script for live refresh; no front-end build step, nothing fetched from elsewhere.

``DashboardFirst`` puts it in front of the REST API (``onbeat.api.create_app`` does), with its own
login by API key and a signed session cookie (``session``).
"""

from onbeat.dashboard.app import DashboardFirst, create_dashboard

__all__ = ["DashboardFirst", "create_dashboard"]
