"""How the Ray executor reaches Ray: the driver's connection, an address checked at once (reachable, and not
refusing this process for want of Ray's authentication token), and never a second cluster for one driver.

Ray is imported when a function is called, never at import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from hwplace import ConfigError
from hwplace.executor import quiet_workers

if TYPE_CHECKING:
    from types import ModuleType

NO_FAILURE_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"
CONNECT_TIMEOUT = 5.0  # seconds to reach a host:port address before Ray's own, much longer, retries


def import_ray() -> ModuleType:
    try:
        import ray  # noqa: PLC0415 (optional: Ray, imported on first use)
    except ImportError as exc:
        raise ConfigError("cluster.executor", f"the Ray executor needs Ray, which is not installed ({exc})",
                          allowed="pip install 'hwplace[ray]'") from None
    return ray


def connect(address: str | None) -> ModuleType:
    """Ray, connected: the driver's existing connection, else ``address`` (or ``RAY_ADDRESS``, or a Ray started
    on this machine), else a new embedded local Ray. ``address: local`` always starts a new one.

    With a connection already made, an address that names another cluster (or ``local``) is an error: the
    driver cannot join two clusters, and ignoring the config would run the job somewhere else than it says.
    """
    ray = import_ray()
    if ray.is_initialized():
        check_same_cluster(ray, address)
        return ray
    target = address or os.environ.get("RAY_ADDRESS") or None
    if target and target != "local":  # an existing cluster (a new one makes its own token)
        check_token()
    if target and target not in ("auto", "local") and "://" not in target:
        check_reachable(target)
        check_authenticated(target)
    try:
        init(ray, address=address)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        where = address or os.environ.get("RAY_ADDRESS") or "a local Ray"
        raise ConfigError("cluster.address", f"cannot connect to {where}: {exc}",
                          allowed="'auto' (a running cluster), 'local' (a new one on this machine), "
                          "'host:port' or 'ray://host:port'; leave it out to use a running Ray or start one") from None
    return ray


def init(ray: ModuleType, **options: object) -> None:
    """``ray.init(**options)`` as hwplace starts its driver: keeping the program's SIGTERM handler, and with
    :func:`hwplace.executor.quiet_workers` (``hwplace run``), workers' output and Ray's own log lines (the
    raylet's warnings) kept off the terminal, in Ray's logs, which one line on stderr names."""
    quiet = quiet_workers()
    with own_sigterm(driver=True):
        ray.init(**options, log_to_driver=not quiet, logging_level=logging.WARNING if quiet else logging.INFO)
    if quiet:
        sys.stderr.write(f"hwplace: workers' output and Ray's log lines are not shown here: see {logs_folder(ray)} "
                         "(hwplace run --worker-output shows them)\n")


def logs_folder(ray: ModuleType) -> str:
    """Where Ray writes this node's logs (workers' output included): the session's ``logs`` folder."""
    try:
        return str(ray._private.worker.global_worker.node.get_logs_dir_path())
    except Exception:  # Ray's internals moved: say where they are by default
        return "Ray's session folder on each node (/tmp/ray/session_latest/logs)"


@contextlib.contextmanager
def own_sigterm(driver: bool = False) -> Iterator[None]:
    """Keep the program's own SIGTERM handler (``hwplace run``'s: exit 143 with one line, the job's groups shut
    down) through the block, where it has one: ``ray.init`` replaces it with one that exits mid-call, a node
    started in this process with one that drains it for 30 s. With ``driver`` (around ``ray.init``), the
    driver's core worker is also started without the failure handler that prints a native stack dump on
    SIGTERM. A program without a handler of its own gets Ray's."""
    own = None
    if threading.current_thread() is threading.main_thread():
        own = signal.getsignal(signal.SIGTERM)
        if own in (signal.SIG_DFL, signal.SIG_IGN, None):
            own = None
    if own is None:
        yield
        return
    before = os.environ.get(NO_FAILURE_HANDLER)
    if driver:  # read by the driver's core worker as ray.init starts it; no node is started meanwhile
        os.environ[NO_FAILURE_HANDLER] = "1"
    try:
        yield
    finally:
        if driver and before is None:
            os.environ.pop(NO_FAILURE_HANDLER, None)
        elif driver and before is not None:
            os.environ[NO_FAILURE_HANDLER] = before
        signal.signal(signal.SIGTERM, own)


def connected(what: str) -> ModuleType:
    """Ray, when this process is still connected to the cluster it discovered; a ``ConfigError`` saying that
    cluster is gone (``ray.shutdown()``) otherwise, where Ray would say only that it "has not been initialized"."""
    ray = import_ray()
    if not ray.is_initialized():
        raise ConfigError("cluster", f"{what}: the Ray cluster this process was connected to is gone "
                          "(ray.shutdown() was called)", allowed="connect again first: make a new "
                          "hwplace.Cluster(cluster_cfg)")
    return ray


def check_same_cluster(ray: ModuleType, address: str | None) -> None:
    """Refuse an ``address`` that is not the cluster this process is connected to (``None`` and ``auto`` accept it)."""
    if address in (None, "auto"):
        return
    joined = ray.get_runtime_context().gcs_address
    if address != "local" and "://" not in address and _resolved(address) == _resolved(joined):
        return
    raise ConfigError("cluster.address", f"this process is already connected to the Ray cluster at {joined}, so "
                      f"it cannot {'start a new local one' if address == 'local' else 'join ' + repr(address)}",
                      value=address, allowed=f"leave cluster.address out (or write {joined}) to use the connected "
                      "cluster, or call ray.shutdown() first")


def _resolved(address: str) -> tuple[str, str]:
    host, _, port = address.rpartition(":")
    try:
        return socket.gethostbyname(host.strip("[]")), port
    except OSError:
        return host, port


TOKEN_HELP = ("set RAY_AUTH_MODE=token and give this process the cluster's token: RAY_AUTH_TOKEN=$(ray "
              "get-auth-token) where the head node runs, or its ~/.ray/auth_token copied here (or RAY_AUTH_TOKEN_PATH)")


def token_problem() -> str | None:
    """Why this process has no token for Ray's token authentication (``RAY_AUTH_MODE=token``), or ``None``.

    Ray 2.60 takes the token from ``RAY_AUTH_TOKEN``, else from the file ``RAY_AUTH_TOKEN_PATH`` names, else
    from ``~/.ray/auth_token``."""
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() != "token" or os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return None
    named = os.environ.get("RAY_AUTH_TOKEN_PATH", "").strip()
    path = os.path.expanduser(named) if named else os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            if file.read(4096).strip():
                return None
        found = f"{path} is empty"
    except FileNotFoundError:
        found = f"there is no {path}"
    except OSError as exc:
        found = f"{path} cannot be read ({exc.strerror or exc})"
    if named:
        return f"RAY_AUTH_TOKEN is not set, and RAY_AUTH_TOKEN_PATH names a file, but {found}"
    return f"RAY_AUTH_TOKEN and RAY_AUTH_TOKEN_PATH are not set, and {found}"


def check_token() -> None:
    """Fail at once when ``RAY_AUTH_MODE=token`` and this process has no token: Ray fails deep inside instead
    (a native "you have likely discovered a bug in Ray" report, or a head that never starts)."""
    problem = token_problem()
    if problem is not None:
        raise ConfigError("RAY_AUTH_MODE", f"is 'token' (Ray's token authentication), but this process has no "
                          f"token: {problem}", allowed="give it the cluster's token: RAY_AUTH_TOKEN=$(ray "
                          "get-auth-token) where the head node runs, or that node's ~/.ray/auth_token copied here (or "
                          "named by RAY_AUTH_TOKEN_PATH); or unset RAY_AUTH_MODE where no cluster needs one")


def check_authenticated(address: str) -> None:
    """Fail at once, saying why and what to do, when the cluster at ``address`` refuses this process: Ray's token
    authentication (on by default for ``ray start`` clusters) and no or a wrong token here. Ray itself retries
    for 20 s and then says only that it could not connect."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # noqa: PLC0415 (optional: Ray)
    from ray.exceptions import AuthenticationError  # noqa: PLC0415 (optional: Ray)

    try:
        GcsClient(address=address).internal_kv_get(b"hwplace", None, timeout=CONNECT_TIMEOUT)
    except AuthenticationError:
        pass
    except Exception:
        return
    else:
        return
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() != "token":
        why = "this process does not use it (RAY_AUTH_MODE is not 'token': Ray never sends a token to an " \
              "address given explicitly unless told to)"
    elif not any(os.environ.get(v) for v in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")) and \
            not os.path.isfile(os.path.expanduser("~/.ray/auth_token")):
        why = "this process has no token"
    else:
        why = "the token this process has is not the cluster's"
    raise ConfigError("cluster.address", f"the Ray cluster at {address} refused the connection: it requires Ray's "
                      f"token authentication and {why}", allowed=TOKEN_HELP)


def check_reachable(address: str) -> None:
    """Fail at once when nothing answers at a ``host:port`` Ray address (Ray itself retries for minutes)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError("cluster.address", f"{address!r} is not host:port",
                          allowed="'auto', 'local', 'host:port' or 'ray://host:port'")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise ConfigError("cluster.address", f"nothing answers at {address} ({exc.strerror or exc})",
                          allowed="the address of a running Ray head (ray start --head prints it), 'auto' for the "
                          "one on this machine, or leave it out to start an embedded local Ray") from None
