"""Wolfpack shared plumbing: settings, gRPC bootstrap, telemetry, Redis streams, and the generated
``wolfpack.v1`` protobuf package. Services import from here; nothing here imports a service."""

__version__ = "0.1.0"

SERVICES: tuple[str, ...] = ("environment", "inference", "reward", "curriculum", "rollout", "trainer")
"""Every service, in start-up order (leaf services first)."""
