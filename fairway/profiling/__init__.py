"""Prefill-time tables T(L), the profiler that measures them, and the step-time models.

- `table`: the T(L) table file (load, validate, interpolate; shipped tables in `fairway/profiles/`).
- `step_time`: the one step-time model interface and its implementations (table, fits).
- `fits`: the fitted curves (quadratic, self-calibrated) and the table file's `step_time` entry.
- `profiler`: measure T(L) on a live server over HTTP (a `ProfileRun` of raw samples).
- `measured_profile`: a run's table (non-decreasing medians, the fitted curve, the metadata).
- `profile_report`: that table as text and as a plot.
- `hardware`: this machine's accelerator or CPU, for the table's `hardware` entry.
- `calibration`: fit a step-time model to an engine's own step times (self-calibration).
- the `fairway profile` verb lives in `fairway/cli/profile.py`.

Must not import vllm.
"""
