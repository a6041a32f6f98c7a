"""Alembic's entry point for these migrations: :func:`llmmesh.core.migrations.run_env`."""

from llmmesh.core.migrations import run_env

run_env()
