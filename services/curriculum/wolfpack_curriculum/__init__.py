"""Wolfpack curriculum service."""
