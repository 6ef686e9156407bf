"""Wolfpack trainer service."""
