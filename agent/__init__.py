"""Muster agent: runs on each GPU host, reports telemetry and runs assigned tasks."""
