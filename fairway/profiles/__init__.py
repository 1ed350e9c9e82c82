"""Shipped prefill-time tables (JSON; format in `fairway.profiling.table`); see their metadata."""
