"""Muster's web console: server-rendered jinja2 templates driven by htmx."""
