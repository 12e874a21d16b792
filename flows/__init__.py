"""Prefect flows: compose tasks, nothing else."""
