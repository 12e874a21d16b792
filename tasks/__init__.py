"""Prefect tasks: thin wrappers around one library call each."""
