"""The ``wolfpack`` command line (Typer + Rich)."""
