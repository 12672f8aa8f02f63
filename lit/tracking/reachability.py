"""Is the tracking server there? Asked once, quickly, before anything is built or trained.

MLflow's HTTP client retries a refused connection with exponential backoff (7 retries, factor 2, 120 s
timeout by default): a ``fit`` pointed at a server that is down waited about four minutes and ended in a
wall of tracebacks, having trained nothing. Here a server is probed once with a short timeout, and what
happens when it does not answer is the user's explicit choice (``MLflowLogger(if_unreachable=...)``):

- ``fail`` (default): one line that says what to do.
- ``local``: log to the local sqlite store instead, with a warning that names the run and the command
  that copies it to the server later (``python cli.py sync run ...``).

Once training runs, requests that fail must fail fast too, so that training never waits minutes on a
server that went away (its metrics are kept and sent later, ``outbox.py``): ``fail_fast``
shortens MLflow's retries for the process, unless the user set them.
"""

from __future__ import annotations

import logging
import os
import urllib.error
import urllib.request

PROBE_TIMEOUT_S = 3.0
# MLflow reads these per request. Retrying a refused connection 3 times takes ~4 s instead of ~4 min.
FAIL_FAST = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
             "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
CHOICES = ("fail", "local")


def is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def unreachable_reason(uri: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the tracking server at ``uri`` cannot be used now, or None when it answers (or is not a server).

    Any HTTP answer below 500 counts as reachable (a proxy or an authenticating gateway may refuse
    ``/health`` itself); a refused or timed-out connection, or a server error, does not.
    """
    if not is_remote(uri):
        return None
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):
            return None
    except urllib.error.HTTPError as exc:
        return None if exc.code < 500 else f"it answers HTTP {exc.code}"
    except urllib.error.URLError as exc:
        return f"{getattr(exc.reason, 'strerror', None) or exc.reason}"
    except (TimeoutError, OSError) as exc:
        return f"no answer within {timeout:g} s" if isinstance(exc, TimeoutError) else str(exc)


def unreachable_message(uri: str, reason: str, local_uri: str) -> str:
    return (f"the MLflow tracking server {uri} is not reachable ({reason}); start it (mlflow server --host ... "
            f"--port ...), or log to the local store with --trainer.logger.init_args.tracking_uri={local_uri}, or "
            f"let runs fall back to it when the server is down with "
            f"--trainer.logger.init_args.if_unreachable=local (the run can be copied to the server later)")


def fail_fast() -> None:
    """Shorten MLflow's HTTP retries for this process (a value the user set wins).

    urllib3 logs every retry as a warning; while a server is away the metric outbox says so in one line
    instead, so those lines are left out (errors still show).
    """
    for key, value in FAIL_FAST.items():
        os.environ.setdefault(key, value)
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
