"""Pytree values: checking leaves against columns, stacking records."""
