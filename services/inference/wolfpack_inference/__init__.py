"""Wolfpack inference service."""
