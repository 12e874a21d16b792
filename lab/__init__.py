"""Investigations: one-off experiments that asked a question of the product, and their results.

Run from the repository root as modules (``python -m lab.recovery_predictors``);
``lab/README.md`` indexes what each asked and found.
"""
