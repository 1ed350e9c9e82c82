"""Trace replay: the virtual clock (`sim`), the live HTTP client (`live`) and reports (`report`).

Only the result records are imported here; `sim` (vLLM), `live` (aiohttp) and `report`
(matplotlib) are heavy and imported by whoever needs them.
"""

from fairway.replay.results import ReplayResult, RequestResult

__all__ = ["ReplayResult", "RequestResult"]
