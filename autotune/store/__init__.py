"""The runs folder: the run record and its files, sweeps, the latest run, the words of run.json."""
