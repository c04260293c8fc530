"""Analysis over recorded runs: compare, fits, predictions, plots."""
