"""Wolfpack reward service: the gRPC adapter (``server``) over the reward specs of ``wolfpack_rewards``."""
