"""Wolfpack reward service."""
