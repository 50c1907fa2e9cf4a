"""Muster control plane: scheduler, API, console and CLI."""
