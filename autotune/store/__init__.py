"""The store: the run record and its files, sweeps, cleanup of what a killed run left, paste-ready files."""
