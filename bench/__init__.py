"""Benchmarks that back the README's claims, and the report code that turns their JSON into
tables.

They ship with the source checkout, not with the installed package: run them from the
repository root as modules (``python -m bench.compare``), or through ``autocompress bench``.
One-off investigations live in ``lab/``.
"""
