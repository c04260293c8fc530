"""The run record as types: RunRecord (run.json) and its parts, and the sweep record (sweep.json).

Each class has from_dict / to_dict (from_json: from_dict without the copy, for JSON just parsed
that nothing else holds), and the round trip is exact (part.py): a key absent from the file
stays absent, a key this autotune does not model is kept in `other`, and keys come back in the
order they were read. docs/artifact.md describes these fields (tests/store/test_record.py checks that it
names each one).

Loading goes through store/artifact.py (load, with the version check and migrations); the
sweep record through store/sweeps.py.
"""

from autotune.store.record.attempt import Attempt
from autotune.store.record.boot_parts import BootFacts, BootPrediction, ProbeResult, Recovery, StopReport, Verification
from autotune.store.record.part import Part, copy_json, given
from autotune.store.record.run import RECORD_ORDER, RESULT_FIGURES, Command, Reach, ReachStep, Result, RunRecord
from autotune.store.record.run_parts import AimPrediction, GpuPlan, KeptOptions, Longest, Machine, Margin, RunWarning
from autotune.store.record.sweep import SweepPoint, SweepRecord

RECORD_CLASSES = (RunRecord, Command, Attempt, Result, Reach, ReachStep, SweepPoint, BootFacts, BootPrediction,
                  ProbeResult, Recovery, StopReport, Verification, AimPrediction, GpuPlan, KeptOptions, Machine,
                  Margin, Longest, RunWarning)

__all__ = ["RECORD_CLASSES", "RECORD_ORDER", "RESULT_FIGURES", "AimPrediction", "Attempt", "BootFacts", "BootPrediction",
           "Command", "GpuPlan", "KeptOptions", "Longest", "Machine", "Margin", "Part", "ProbeResult", "Reach", "ReachStep",
           "Recovery", "Result", "RunRecord", "RunWarning", "StopReport", "SweepPoint", "SweepRecord", "Verification",
           "copy_json", "given"]
