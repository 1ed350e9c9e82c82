"""Shipped prefill-time tables (JSON, format in `fairway.profile`); see each file's metadata."""
