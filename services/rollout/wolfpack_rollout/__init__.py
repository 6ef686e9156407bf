"""Wolfpack rollout service."""
