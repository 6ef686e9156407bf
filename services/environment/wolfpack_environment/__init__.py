"""Wolfpack environment service: game engines, episode sessions and the gRPC adapter around them."""
