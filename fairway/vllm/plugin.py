"""The `vllm.general_plugins` entry point: runs in every vLLM process (front end, EngineCore,
workers), before the scheduler class is resolved.

It does four cheap things and never raises because of a bug of its own (a broken plugin must not
be the reason a server does not start):

* in a `vllm serve ... --scheduler-cls fairway.vllm...` process, checks Fairway's options and
  `FAIRWAY_*` variables from the command line and the environment, and stops the server with
  `fairway: error: <reason>` as its last line, before the model loads (the API server loads
  plugins while it builds its argument parser; the scheduler's own check would come only after
  the model and the KV cache are set up); with trust enforced (`fairway.trust`) it also draws
  the secret the middleware and the scheduler share, which the engine processes inherit;
* routes the `fairway` logger to vLLM's handlers, at vLLM's level: vLLM configures only the
  `vllm` logger, with `propagate=False`, so `fairway.*` INFO lines (start-up options) would
  otherwise vanish;
* logs the Fairway version once per process;
* warns if the installed vLLM is not a release Fairway supports (`fairway.vllm_versions`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping

from vllm.logger import init_logger

import fairway
from fairway import vllm_versions
from fairway.errors import FairwayError

logger = init_logger(__name__)

_registered = False


def register() -> None:
    """Entry point `fairway = "fairway.vllm.plugin:register"`; idempotent and never raises."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        attach_vllm_logging()
        version = _vllm_version()
        logger.info("Fairway %s plugin loaded (vLLM %s).", fairway.__version__, version)
        problem = version_problem(version)
        if problem:
            logger.warning("Fairway: %s", problem)
    except Exception:  # noqa: BLE001 - a plugin must never stop vLLM
        logger.exception("Fairway plugin registration failed")
    check_serve_command(sys.argv, os.environ)


def check_serve_command(argv: list[str], environ: MutableMapping[str, str]) -> None:
    """Stop a `vllm serve` with Fairway's scheduler and bad Fairway options now (SystemExit);
    set up the trust model's secret in `environ` (`fairway.middleware.prepare_server`), before
    vLLM starts the engine processes that inherit it.

    A bug in the check itself is logged and ignored: the scheduler checks again at start-up.
    """
    try:
        from fairway.middleware import prepare_server
        from fairway.vllm_argv import options_from_vllm_argv

        options = options_from_vllm_argv(argv, environ)
        if options is not None:
            prepare_server(options, argv, environ)
    except FairwayError as exc:
        raise SystemExit(f"fairway: error: {exc}") from None
    except Exception:  # noqa: BLE001 - a plugin must never stop vLLM
        logger.exception("Fairway's early option check failed (the scheduler checks again)")


class _ToVllmHandlers(logging.Handler):
    """Hands `fairway.*` records to whatever handlers the `vllm` logger has *now*.

    Copying vLLM's handlers once would miss a later configuration: the API server loads plugins
    while building its argument parser, before it configures logging from the parsed flags. With
    vLLM logging unconfigured (library use, tests) the record goes where a `vllm.*` record would:
    up to the root logger.
    """

    def emit(self, record: logging.LogRecord) -> None:
        # Walk from `vllm` up as a vllm.* record would, skipping handlers the `fairway` logger
        # has itself (test frameworks attach theirs to non-propagating loggers and the root).
        own = logging.getLogger("fairway").handlers
        logger: logging.Logger | None = logging.getLogger("vllm")
        while logger is not None:
            for handler in logger.handlers:
                if handler not in own and record.levelno >= handler.level:
                    handler.handle(record)
            logger = logger.parent if logger.propagate else None


def attach_vllm_logging() -> None:
    """Route the `fairway` logger's records to vLLM's handlers, at vLLM's level. Idempotent."""
    target = logging.getLogger("fairway")
    if not any(isinstance(h, _ToVllmHandlers) for h in target.handlers):
        target.addHandler(_ToVllmHandlers())
    target.propagate = False  # the handler above already delivers it (no double lines)
    target.setLevel(_vllm_level())


def _vllm_level() -> int:
    """The `vllm` logger's level, or the VLLM_LOGGING_LEVEL it will be configured with."""
    level = logging.getLogger("vllm").level
    if level != logging.NOTSET:
        return level
    import vllm.envs as envs

    resolved = logging.getLevelName(str(envs.VLLM_LOGGING_LEVEL).upper())
    return resolved if isinstance(resolved, int) else logging.INFO


def _vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def version_problem(version: str) -> str | None:
    """A warning text if `version` is not a supported release (any patch of one), else None."""
    if vllm_versions.release(version) is None:
        return (
            f"cannot parse the vLLM version {version!r}; Fairway supports vLLM "
            f"{vllm_versions.describe()}"
        )
    if vllm_versions.is_supported(version):
        return None
    return (
        f"vLLM {version} is not a release Fairway {fairway.__version__} supports "
        f"({vllm_versions.describe()}). The scheduler checks the vLLM internals it needs at "
        f"start-up and refuses to start if one is missing or changed; run `make rebase "
        f"VLLM={version.split('+')[0]}` to test this version."
    )
