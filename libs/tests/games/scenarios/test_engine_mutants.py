"""Tests written against surviving mutants of the scenario engine (libs/wolfpack_games/scenarios/engine.py).

Each expectation comes from the rules as written in the engine docstring and the family docs, worked out by
hand; none is copied from the engine's output.
"""
