"""MLflow tracking: the only module that imports mlflow (≈4 s), and only inside its functions.

One experiment per dataset (``<prefix>-<dataset>``), one run per (variant, seed).

Where runs go (``tracking_uri``):

* ``MLFLOW_TRACKING_URI`` when set, e.g. ``http://127.0.0.1:5000`` for a running ``mlflow server``;
* else ``sqlite:///<repo root>/mlflow.db``, the repo root being ``DVC_ROOT`` when DVC runs the stage, else the
  ``root`` the stage passes (the folder of params.yaml).

Queued (``dvc exp run --queue`` + ``dvc queue start``) and ``--temp`` experiments run in temporary copies of the
repo under ``<repo>/.dvc/tmp/exps/``. There DVC (3.x) sets ``DVC_ROOT`` to the *parent* repo, not to the copy
(the copy is the stage's working directory, see :func:`pipeline.config.project_root`), so their runs land in the
user's ``<repo>/mlflow.db`` next to the workspace runs. A root inside ``.dvc/tmp/`` (older DVC, or a stage run
by hand inside a copy) is mapped back to the repo that holds it: no run is left behind in a copy DVC deletes.

Artifacts of a SQLite store go to ``<store folder>/mlruns/<experiment>/``, fixed when ``RunTracker`` creates the
experiment. (MLflow's own default, ``./mlruns`` of the working directory at creation, would put them into the
copy of whichever queued experiment created it, for that run and every later one.) A tracking server decides
artifact locations itself (``--artifacts-destination``).

Several experiments (``dvc queue start -j N``) may open a new SQLite store at the same moment; MLflow creates its
tables with unguarded Alembic migrations, which race. ``RunTracker`` therefore creates/opens the store and its
experiment under an exclusive ``flock`` on the store's folder; later writes use MLflow's own 20 s busy timeout.

``RunTracker`` sets no process-wide MLflow state (``mlflow.set_tracking_uri`` also exports
``MLFLOW_TRACKING_URI``, which would send every later tracker of the process to the first one's store); only
``log_model``, which needs MLflow's fluent API, sets the URI for its duration.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Mapping

from pipeline.messages import brief


class TrackingError(RuntimeError):
    """The tracking store cannot be used; the message names the URI."""


def _uninterrupted(method):
    """A RunTracker method that talks to the store, run whole: SIGTERM waits for it (:func:`held_interrupts`)."""
    import functools

    from pipeline.io import held_interrupts

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with held_interrupts():
            return method(*args, **kwargs)
    return wrapper


def store_root(path: str | os.PathLike) -> Path:
    """The repo whose ``mlflow.db`` a stage at ``path`` logs into: ``path`` itself, or, for a temporary
    experiment copy ``<repo>/.dvc/tmp/...``, ``<repo>`` (:func:`pipeline.config.user_repo`)."""
    from pipeline.config import user_repo

    return user_repo(path)


def tracking_uri(root: str | os.PathLike | None = None) -> str:
    """The store a stage logs into: ``MLFLOW_TRACKING_URI`` when set, else ``<repo>/mlflow.db``. A relative SQLite
    path in the variable (``sqlite:///mlflow.db``, as ``mlflow ui`` takes it) is the user's repo's file, not one in
    a queued experiment's copy ``<repo>/.dvc/tmp/exps/...``, where SQLite would open it (a new, empty store that DVC
    deletes with the copy: every run of the experiment was lost)."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        db, mark, query = env[len("sqlite:///"):].partition("?")
        # a relative path, not sqlite:/// or sqlite:///:memory: (in memory: refused where a store must hold runs)
        if env.startswith("sqlite:///") and db and not db.startswith(":") and not Path(db).is_absolute():
            # from where SQLite opens it, the working directory (DVC_ROOT is the user's repo or the copy, by DVC
            # version), or in a copy the user's repo; absolute, so that a run's fingerprint, which holds the store,
            # is the same in the workspace and in a copy (else every unchanged run was "logged again")
            return f"sqlite:///{store_root(Path.cwd()) / db}{mark}{query}"
        return env
    base = store_root(os.environ.get("DVC_ROOT") or root or Path.cwd())
    return f"sqlite:///{base / 'mlflow.db'}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative to the working directory, as SQLite opens it)."""
    return Path(uri[len("sqlite:///"):].split("?", 1)[0]) if uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Exclusive lock (``flock`` on the store's folder) while a SQLite store is created or opened: concurrent
    first opens would run MLflow's Alembic migrations twice and fail ("Online migration expected to match one
    row..."). No-op for other stores and where ``fcntl`` does not exist."""
    db = sqlite_path(uri)
    if db is None:
        yield
        return
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    fd = os.open(db.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment's artifacts go: ``<store folder>/mlruns/<experiment>`` for a SQLite store, else
    the store's default (None)."""
    db = sqlite_path(uri)
    if db is None:
        return None
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in experiment)
    return str(db.resolve().parent / "mlruns" / safe)


@contextlib.contextmanager
def fluent_tracking_uri(mlflow, uri: str) -> Iterator[None]:
    """MLflow's fluent API (``mlflow.pytorch.log_model``, ``load_model``) reads a process-wide URI; set it for the
    block only and
    restore ``MLFLOW_TRACKING_URI`` as it was (``mlflow.set_tracking_uri`` exports it)."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)  # None unsets it


def redacted(uri: str) -> str:
    """``uri`` with the password of its user information (``http://user:secret@host``) shown as ``***``: how
    messages and logs name a store."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    netloc, slash, tail = rest.partition("/")
    userinfo, at, host = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return uri
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}{slash}{tail}"


def _store_label(uri: str) -> str:
    """How an error names the store: by the variable that chose it, or as the default it is."""
    if os.environ.get("MLFLOW_TRACKING_URI") == uri:
        return f"MLFLOW_TRACKING_URI={redacted(uri)}"
    return f"tracking store {redacted(uri)} (the default; MLFLOW_TRACKING_URI overrides)"


def _health_request(uri: str) -> urllib.request.Request:
    """GET <uri>/health, with the credentials MLflow's client would send: the URI's user information (which
    urllib, unlike the ``requests`` under MLflow, would take for part of the host name), else
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``, else ``MLFLOW_TRACKING_TOKEN``. Raises ValueError
    for a URL that cannot be parsed (``http://[::1``)."""
    parts = urllib.parse.urlsplit(uri)
    host = parts.hostname
    if not host:
        raise ValueError("no host name")
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", parts.query, ""))
    headers = {}
    user = urllib.parse.unquote(parts.username) if parts.username is not None else None
    password = urllib.parse.unquote(parts.password or "") if user is not None else None
    if user is None and os.environ.get("MLFLOW_TRACKING_USERNAME"):
        user = os.environ["MLFLOW_TRACKING_USERNAME"]
        password = os.environ.get("MLFLOW_TRACKING_PASSWORD", "")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"
    return urllib.request.Request(url, headers=headers)


#: URI schemes MLflow tracks to (its ``TrackingStoreRegistry``); a plain path (no scheme) is its file store
KNOWN_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "file", "databricks", "databricks-uc",
                 "uc")
# a known scheme written without "://": "http//host", "http:/host", "http:host" (MLflow takes the first two for a
# folder of its deprecated file store, "filesystem tracking backend ... maintenance mode", and fails on the third)
_MISTYPED = re.compile(r"(?P<scheme>" + "|".join(re.escape(k) for k in sorted(KNOWN_SCHEMES, key=len, reverse=True))
                       + r")(?P<sep>//|:/(?!/)|:(?!/))(?P<rest>.*)", re.IGNORECASE)
# "localhost:5000", "127.0.0.1:5000/": a server address without its http://
_HOST_PORT = re.compile(r"[A-Za-z0-9.-]+:[0-9]{1,5}/?")
#: the database schemes MLflow also takes with a SQLAlchemy driver, "postgresql+psycopg2://..."
#: (mlflow.store.db.db_types.DATABASE_ENGINES; mlflow.utils.uri.extract_db_type_from_uri)
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql", "sqlite")
_DRIVER = re.compile(r"[A-Za-z0-9_]+")
_EXPECTED_SCHEMES = ("expected a URI MLflow tracks to: http(s)://host:port, sqlite:///path, "
                     "postgresql://, mysql:// or mssql:// (also with a driver, e.g. postgresql+psycopg2://), "
                     "or databricks")


def _scheme_problem(scheme: str) -> str | None:
    """Why MLflow would not track to a URI of ``scheme`` (the text before "://"), or None."""
    import difflib

    engine, plus, driver = scheme.lower().partition("+")
    if not plus and engine in KNOWN_SCHEMES or plus and engine in DATABASE_SCHEMES and _DRIVER.fullmatch(driver):
        return None
    if plus and engine in DATABASE_SCHEMES:
        return f"the driver of scheme {brief(scheme, 40)} is not a SQLAlchemy driver name; {_EXPECTED_SCHEMES}"
    close = difflib.get_close_matches(engine, KNOWN_SCHEMES, n=1)
    hint = f" (a misspelled {close[0]}://?)" if close else ""
    return f"unknown scheme {brief(scheme, 40)}{hint}; {_EXPECTED_SCHEMES}"


def uri_problem(uri: str) -> str | None:
    """What is wrong with a tracking URI before anything is sent to it, or None: an in-memory SQLite database
    (``sqlite://``, ``sqlite:///``, ``sqlite:///:memory:``: every run logged there vanishes when the process ends), a
    ``sqlite:`` URI without its three slashes, or a mistyped URL (``http//host:5000``, ``http:/host``,
    ``localhost:5000``), which MLflow would otherwise take for a folder of its file store (refused even when that
    folder exists: MLflow made it the first time the typo was used), or a scheme MLflow does not track to
    (``sqllite:///x.db``, which MLflow refuses in a multi-line exception): :data:`KNOWN_SCHEMES`, and the database
    schemes with a driver (``postgresql+psycopg2://``). Other plain paths are file stores, as MLflow takes them."""
    if not isinstance(uri, str) or not uri.strip():
        return "empty; expected a URI such as http://127.0.0.1:5000 or sqlite:///path/to/mlflow.db"
    head = uri.split("?", 1)[0]
    if head.lower().startswith("sqlite:"):
        if head.lower() == "sqlite://" or (head.lower().startswith("sqlite:///")
                                          and head[len("sqlite:///"):] in ("", ":memory:")):
            return ("an in-memory SQLite database, whose runs vanish when the process ends; expected "
                    "sqlite:///<path of the database file>, e.g. sqlite:///mlflow.db")
        if not head.lower().startswith("sqlite:///"):
            return "not a SQLite URI MLflow can open; expected sqlite:///<path of the database file>"
        return None
    if "://" in uri:
        return _scheme_problem(uri.split("://", 1)[0])
    m = _MISTYPED.fullmatch(uri)
    if m is not None and m.group("scheme").lower() != "file":
        scheme, rest = m.group("scheme").lower(), m.group("rest").lstrip("/")
        wanted = f"{scheme}://{rest}" if scheme in ("http", "https") and rest else f"{scheme}://..."
        typed = m.group("scheme") + m.group("sep")
        return f"looks like a mistyped URL ({typed} instead of {scheme}://); expected {wanted}"
    if m is not None and m.group("sep") == "//":   # file//path
        return ("looks like a mistyped URL (file// instead of file://); expected sqlite:///<path>/mlflow.db (or "
                "file:///<absolute path> with MLFLOW_ALLOW_FILE_STORE=true)")
    if _HOST_PORT.fullmatch(uri):
        return f"looks like a server address without its scheme; expected http://{uri.rstrip('/')}"
    return None


def server_problem(uri: str, timeout: float = 5.0) -> str | None:
    """What keeps an HTTP(S) tracking server from being used, asked with GET /health within ``timeout`` seconds
    (MLflow's own client retries for minutes before it gives up); None when it answers, or when ``uri`` is no
    HTTP URI."""
    if not uri.lower().startswith(("http://", "https://")):
        return None
    try:
        request = _health_request(uri)
    except ValueError as exc:
        return f"not a URL that can be read ({exc}); expected http(s)://host:port, e.g. http://127.0.0.1:5000"
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=_tls_context()) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLError):   # the server answers; its certificate is what is not trusted
            return (f"TLS verification failed ({reason}); expected a certificate this machine trusts, or "
                    "MLFLOW_TRACKING_SERVER_CERT_PATH=<CA bundle> (MLFLOW_TRACKING_INSECURE_TLS=true to skip the "
                    "check), as MLflow's client reads them")
        return f"tracking server unreachable ({reason})"
    if status != 200:  # an MLflow server answers GET /health with 200 "OK"
        return f"GET /health answered HTTP {status}; expected 200 from an MLflow tracking server"
    return None


def _tls_context() -> ssl.SSLContext:
    """The TLS settings MLflow's client uses for a tracking server: ``MLFLOW_TRACKING_INSECURE_TLS=true`` skips
    verification, ``MLFLOW_TRACKING_SERVER_CERT_PATH`` (else ``REQUESTS_CA_BUNDLE``, which requests reads) names
    the CA bundle; else the system's. A self-signed server that MLflow reaches is so reached by the check too."""
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").strip().lower() == "true":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    bundle = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or os.environ.get("REQUESTS_CA_BUNDLE")
    return ssl.create_default_context(cafile=bundle) if bundle else ssl.create_default_context()


def check_tracking_uri(uri: str, timeout: float = 5.0) -> None:
    """Fail fast (seconds, before any training) when the URI cannot be a lasting store (:func:`uri_problem`: an
    in-memory database, a mistyped URL), when an HTTP tracking server does not answer, when the folder of a
    SQLite database does not exist or its path holds a file that is no SQLite database (or a folder), or when it
    names MLflow's file store, which MLflow 3 refuses without ``MLFLOW_ALLOW_FILE_STORE``."""
    problem = uri_problem(uri) or server_problem(uri, timeout)
    if problem is not None:
        raise TrackingError(f"{_store_label(uri)}: {problem}")
    db = sqlite_path(uri)
    if db is not None:
        if not db.parent.exists():
            raise TrackingError(f"{_store_label(uri)}: directory {db.parent} does not exist")
        problem = _sqlite_file_problem(db)
        if problem is not None:
            raise TrackingError(f"{_store_label(uri)}: {db} {problem}")
    elif (uri.startswith("file:") or "://" not in uri and uri.lower() not in KNOWN_SCHEMES) \
            and not file_store_allowed():   # a plain path; "databricks" alone is a scheme, not a folder
        # MLflow 3 refuses its file store in a 10-line exception, once the run is about to start
        raise TrackingError(f"{_store_label(uri)}: a path, which MLflow reads as a folder of its file store, and "
                            "which it refuses (its filesystem backend is in maintenance mode); expected "
                            "sqlite:///<path>/mlflow.db (`mlflow migrate-filestore` moves an existing store there), "
                            "or MLFLOW_ALLOW_FILE_STORE=true")


#: the first 16 bytes of every SQLite 3 database file (https://www.sqlite.org/fileformat.html)
SQLITE_HEADER = b"SQLite format 3\x00"


def _sqlite_file_problem(db: Path) -> str | None:
    """Why the file of a ``sqlite:///`` store cannot be a database, or None (it does not exist yet, is empty, or
    starts like one): a file of something else made MLflow fail once training had been set up ("file is not a
    database")."""
    try:
        with open(db, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return "is a directory; expected the path of a SQLite database file"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if head and head != SQLITE_HEADER:
        return "is not a SQLite database (another file at that path?); expected an MLflow SQLite store, or a new path"
    return None


def file_store_allowed() -> bool:
    """Whether MLflow opens its deprecated file store: ``MLFLOW_ALLOW_FILE_STORE`` set true (as MLflow reads it)."""
    return os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("true", "1")


#: what MLflow accepts as a run id (mlflow.utils.validation._RUN_ID_REGEX); the ids it makes are 32 hex digits
RUN_ID = re.compile(r"[a-zA-Z0-9][\w\-]{0,255}")


def check_run_id(run_id: object, option: str = "run_id") -> str:
    """``run_id`` when it is an MLflow run id; else a one-line :class:`ValueError` (MLflow raises its own exception
    for "../x", and a TypeError for None)."""
    if not isinstance(run_id, str) or RUN_ID.fullmatch(run_id) is None:
        raise ValueError(f"{option}={brief(run_id, 60)}: expected an MLflow run id (32 hexadecimal digits, as the "
                         "MLflow UI shows it, e.g. 0123456789abcdef0123456789abcdef)")
    return run_id


def git_commit(root: str | os.PathLike) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


#: tracked files whose changes do not change what a run computes: DVC rewrites dvc.lock at every stage, and the
#: outputs that dvc.yaml keeps out of DVC's cache (plots/, metrics/, reports/results.md and summary.json) are meant
#: to be committed to git, so the stages rewrite (or DVC removes, before a stage runs) files git tracks
_NOT_DIRTYING = ("dvc.lock",)
_NOT_DIRTYING_DIRS = ("plots/", "metrics/", "reports/")


def git_dirty(root: str | os.PathLike) -> str | None:
    """The tracked files of the git work tree at ``root`` that differ from HEAD (staged or not), comma-separated
    (at most 500 characters), "" when none; None outside git. ``dvc.lock`` and the pipeline's uncached outputs
    (``plots/``, ``metrics/``, ``reports/``), which git may track, do not count: the stages rewrite them. A run's
    ``mlflow.source.git.commit`` says what trained it only when this is
    empty: an uncommitted ``params.yaml`` or code change is named in the run's ``git_dirty`` tag."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--no-renames"], cwd=root,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    paths = {line[3:].strip().strip('"') for line in out.stdout.splitlines() if len(line) > 3}
    changed = sorted(p for p in paths if p not in _NOT_DIRTYING and not p.startswith(_NOT_DIRTYING_DIRS))
    shown = ", ".join(changed)
    return shown if len(shown) <= 500 else shown[:497] + "..."


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class _PickleWarningFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Saving pytorch model by Pickle")


@contextlib.contextmanager
def _without_pickle_warning() -> Iterator[None]:
    """Drop the warning ``mlflow.pytorch.log_model`` prints for every pickle-format model (once per run: 72
    identical paragraphs in the full run). The format is deliberate (see :meth:`RunTracker.log_model`), the
    README says what loading it means, and ``load_mlflow_run`` reads the checkpoint instead."""
    logger, filt = logging.getLogger("mlflow.pytorch"), _PickleWarningFilter()
    logger.addFilter(filt)
    try:
        yield
    finally:
        logger.removeFilter(filt)


def _close_stale(client, run_id: str, only_if: Mapping[str, str] | None) -> bool:
    """:meth:`RunTracker.close_stale` with ``client``; whether it closed the run."""
    try:
        run = client.get_run(run_id)
    except Exception:  # deleted, or in another store: nothing to close
        return False
    if run.info.status != "RUNNING" or run.info.lifecycle_stage != "active":  # MLflow refuses a deleted one
        return False
    if any(run.data.tags.get(k) != v for k, v in (only_if or {}).items()):
        return False
    client.set_terminated(run_id, status="KILLED")
    return True


def close_orphan(root: str | os.PathLike, run_id: str, *, only_if: Mapping[str, str],
                 current: str | None = None) -> bool:
    """Mark ``run_id`` KILLED where a kill left it RUNNING in the store of ``root`` (:func:`tracking_uri`) with
    ``only_if``'s tag values, without opening a run; whether it did. ``current``: the run that ``run_id`` was
    opened to replace, current again: its ``superseded_by`` tag naming ``run_id`` is removed. A store that is gone
    (a client would create an empty one) or that cannot be reached closes nothing: an orphan is untidy, not worth
    a failed stage."""
    uri = tracking_uri(root)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        return False
    try:
        check_tracking_uri(uri)
        from mlflow import MlflowClient

        with _store_lock(uri):   # as RunTracker opens it: another process may be creating its tables
            client = MlflowClient(uri)
            client.get_experiment_by_name("Default")   # the first request, where the store is opened
        closed = _close_stale(client, run_id, only_if)
    except Exception:  # noqa: BLE001 - see the docstring
        return False
    try:   # the orphan is closed whatever becomes of this (a current run deleted since: nothing to untag)
        if current and closed and client.get_run(current).data.tags.get("superseded_by") == run_id:
            client.delete_tag(current, "superseded_by")
    except Exception:  # noqa: BLE001 - see the docstring
        pass
    return closed


#: What a DVC experiment's name may hold to name a tag (:func:`dvc_exp_tag`): MLflow refuses other characters in
#: a tag key, and these need no escaping in a filter string's quoted key.
_EXP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def dvc_exp_tag(name: str | None) -> str | None:
    """The tag ``dvc_exp.<name>`` that marks every run of the DVC experiment ``name`` (``DVC_EXP_NAME``): the runs
    it trained and the finished runs it kept, so that ``tags."dvc_exp.<name>" != ''`` lists all of its results
    (``dvc_exp_name`` names only the experiment that trained a run). None for no name, or one MLflow would refuse
    in a tag key (or longer than its 250 characters)."""
    if not name or not _EXP_NAME.fullmatch(name) or ".." in name:
        return None
    key = f"dvc_exp.{name}"
    return key if len(key) <= 250 else None


@_uninterrupted
def tag_run(root: str | os.PathLike, run_id: str, key: str, value: str) -> bool:
    """Set the tag ``key`` of the run ``run_id`` in the store of ``root`` (:func:`tracking_uri`) without opening
    the run, in one request; whether it did. Best effort: a store that is gone (a client would create an empty
    one), refuses or cannot be reached, or a run that is gone or deleted, is left as it is (logged at debug)."""
    uri = tracking_uri(root)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        return False
    # a server that went away must not keep a stage waiting in MLflow's retry loop (as RunTracker)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    try:
        from mlflow import MlflowClient

        with _store_lock(uri):   # as RunTracker opens it: another process may be creating its tables
            MlflowClient(uri).set_tag(run_id, key, value)
        return True
    except Exception as exc:  # noqa: BLE001 - a tag is not worth a failed stage
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        logging.getLogger(__name__).debug("could not tag MLflow run %s %s=%s: %s", run_id, key, value, first[:300])
        return False


class RunTracker:
    """A thin wrapper around one MLflow run, resumable by id (a killed refine continues its run)."""

    def __init__(self, *, root: str | os.PathLike, experiment: str, run_name: str, run_id: str | None = None,
                 tags: Mapping[str, str] | None = None, owner_tags: tuple[str, ...] = (),
                 same_as: tuple[str, ...] = (), adopt: bool = False):
        """Open the run ``run_id`` again if it exists in ``experiment``, is not deleted, and has the same value as
        ``tags`` (or none, like ``tags``) for every key of ``owner_tags``; else, with ``same_as``, the latest run of
        the experiment that has ``tags``' values for every key of ``same_as`` and ``owner_tags`` (``run_id`` is
        another store's: runs logged here before the tracking URI moved away and back are continued, not
        duplicated); with no ``run_id`` and ``same_as``, the latest RUNNING run with those tag values (one that a
        kill left between its creation and the caller's record of its id); else create a new run. ``continued``
        says which; ``foreign`` is True when ``run_id`` exists
        but belongs to another owner (left as it is). ``adopt`` (a finished run logged again, nothing trained):
        the run ``run_id`` is continued whoever its owner (it trained the model, in whichever DVC experiment), one
        found by ``same_as`` must also be FINISHED with the same ``epochs`` tag, and a run continued keeps the tags
        it has and gets none of ``owner_tags``, ``workspace`` or ``host``. A deleted ``experiment`` (its name
        stays taken) is a :class:`TrackingError` saying how to restore or purge it."""
        self.continued = self.foreign = False
        uri = tracking_uri(root)
        check_tracking_uri(uri)
        # a server that goes away later must not keep a stage hanging in MLflow's retry loop
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        import mlflow

        self.mlflow = mlflow
        self.uri = uri
        try:
            self._open(experiment, run_name, run_id, tags, owner_tags, same_as, adopt)
        except TrackingError:
            raise
        except Exception as exc:  # MlflowException, SQLAlchemy errors...: one line naming the store
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise TrackingError(f"{_store_label(uri)}: cannot use the tracking store "
                                f"({type(exc).__name__}: {first[:300]})") from None

    @_uninterrupted
    def _open(self, experiment: str, run_name: str, run_id: str | None, tags: Mapping[str, str] | None,
              owner_tags: tuple[str, ...], same_as: tuple[str, ...] = (), adopt: bool = False) -> None:
        mlflow, uri = self.mlflow, self.uri
        tags = dict(tags or {})
        # adopt: whose the run on record is does not decide whether it is continued, and what its tags say of
        # where it was trained is kept; a run found by its tags instead must also have trained as many epochs
        # and be finished (run_config leaves epochs out: another experiment's longer run is another model)
        kept = (*owner_tags, "workspace", "host") if adopt else ()
        found_by = (*same_as, "epochs") if adopt else (*same_as, *owner_tags)
        if adopt:
            owner_tags = ()
        with _store_lock(uri):
            self.client = mlflow.MlflowClient(uri)
            exp = self.client.get_experiment_by_name(experiment)  # creates a new SQLite store's tables
            exp_id = exp.experiment_id if exp is not None else self._create_experiment(experiment)
        if exp is not None and exp.lifecycle_stage != "active":
            # deleted in the UI: its name stays taken until `mlflow gc`, and MLflow refuses runs in it
            raise TrackingError(
                f"{_store_label(uri)}: MLflow experiment {experiment!r} (id {exp_id}) is deleted; restore it "
                f"(MLFLOW_TRACKING_URI={redacted(uri)} mlflow experiments restore --experiment-id {exp_id}), purge it "
                f"(mlflow gc --experiment-ids {exp_id} on the store) or change tracking.experiment_prefix")
        if run_id is not None:
            try:
                run = self.client.get_run(run_id)
            except Exception:
                run = None
            # a run deleted in the UI (hidden there, purged by `mlflow gc`) is not continued: MLflow refuses to
            # write to it, and a new run gets the epochs so far logged again
            if run is None or run.info.experiment_id != exp_id or run.info.lifecycle_stage != "active":
                run_id = None
            elif any(run.data.tags.get(k) != tags.get(k) for k in owner_tags):
                self.foreign, run_id = True, None
            if run_id is None and run is None and same_as and all(tags.get(k) for k in same_as):
                run_id = self._same_run(exp_id, tags, found_by, status="FINISHED" if adopt else None)
        elif same_as and all(tags.get(k) for k in same_as):
            # no id on record: a run that a kill left RUNNING between its creation and the write of its id (the
            # caller's same_as holds the workspace, which DVC locks: a RUNNING run of it is no live one; a tag
            # "host" tells the same path on two machines that share a tracking server apart)
            keys = (*same_as, *owner_tags, *(("host",) if tags.get("host") else ()))
            run_id = self._same_run(exp_id, tags, keys, status="RUNNING")
        if run_id is None:
            run = self.client.create_run(exp_id, run_name=run_name, tags=tags)
            run_id = run.info.run_id
        else:
            self.client.update_run(run_id, status="RUNNING")
            had = self.client.get_run(run_id).data.tags if adopt else {}
            for k, v in tags.items():
                # adopted: the tags it has stay, and none says it was trained by this experiment or folder
                if k not in had and k not in kept:
                    self.client.set_tag(run_id, k, v)
            self.continued = True
        self.run_id = run_id
        self.experiment_id = exp_id
        self.tags = tags   # as opened (a continued run's are set to these), without a round trip to the store

    def _same_run(self, exp_id: str, tags: Mapping[str, str], keys: tuple[str, ...],
                  status: str | None = None) -> str | None:
        """The id of the latest active run of ``exp_id`` (with ``status``: in that status) whose tags equal ``tags``
        on ``keys`` (a key missing from ``tags`` must be missing from the run too), or None."""
        first = next(k for k in keys if tags.get(k))
        value = str(tags[first]).replace("'", "")
        if value != tags[first]:   # not expressible in a filter string: no search
            return None
        runs = self.client.search_runs([exp_id], filter_string=f"tags.`{first}` = '{value}'",
                                       order_by=["attributes.start_time DESC"], max_results=50)
        for run in runs:
            if run.info.lifecycle_stage == "active" and all(run.data.tags.get(k) == tags.get(k) for k in keys) \
                    and (status is None or run.info.status == status):
                return run.info.run_id
        return None

    def _create_experiment(self, name: str) -> str:
        try:
            return self.client.create_experiment(name, artifact_location=_artifact_location(self.uri, name))
        except Exception:
            # another queued experiment may have created it in the meantime
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    @_uninterrupted
    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        items = [Param(k, str(v)[:6000]) for k, v in flatten(params).items() if k not in existing]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    @_uninterrupted
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in flatten(metrics).items()
                 if isinstance(v, (int, float))]
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    @_uninterrupted
    def log_epoch(self, entry: Mapping[str, Any]) -> None:
        """Per-epoch metrics as ``train_bpc``, ``test_mse``..., ``epoch_seconds`` and ``lr`` at step = epoch
        (0 = the initialisation)."""
        metrics = {}
        for split in ("train", "valid", "test"):
            for k, v in (entry.get(split) or {}).items():
                metrics[f"{split}_{k}"] = v
        if "seconds" in entry:
            metrics["epoch_seconds"] = entry["seconds"]
        if "lr" in entry:   # the learning rate of the epoch's updates (train.lr_decay lowers it)
            metrics["lr"] = entry["lr"]
        self.log_metrics(metrics, step=int(entry["epoch"]))

    @_uninterrupted
    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    @_uninterrupted
    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set several tags in one request (values as text)."""
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:5000]) for k, v in tags.items()]
        if items:
            self.client.log_batch(self.run_id, tags=items)

    @_uninterrupted
    def tag(self, key: str) -> str | None:
        """The run's tag ``key``, or None."""
        return self.client.get_run(self.run_id).data.tags.get(key)

    @_uninterrupted
    def has_logged_model(self, epoch: int, name: str = "model") -> bool:
        """Whether the run already holds a complete logged model ``name`` of the weights of ``epoch`` (tag
        ``epoch``): one that a kill after ``log_model`` but before the run's ``model_epoch`` tag left, which must
        not be logged twice. A store that cannot search logged models answers False."""
        try:
            found = self.client.search_logged_models(
                experiment_ids=[self.experiment_id],
                filter_string=f"source_run_id = '{self.run_id}' AND tags.epoch = '{int(epoch)}'")
        except Exception:
            return False
        return any(m.name == name and str(getattr(m.status, "name", m.status)).upper().endswith("READY")
                   for m in found)

    @_uninterrupted
    def logged_steps(self, metric: str) -> set[int]:
        return {m.step for m in self.client.get_metric_history(self.run_id, metric)}

    @_uninterrupted
    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    @_uninterrupted
    def log_dict(self, data: Mapping[str, Any], artifact_file: str) -> None:
        self.client.log_dict(self.run_id, dict(data), artifact_file)

    @_uninterrupted
    def log_model(self, model, *, name: str = "model", pip_requirements: list[str] | None = None,
                  epoch: int | None = None, units: Mapping[str, Any] | None = None) -> None:
        """``mlflow.pytorch.log_model`` of the whole module, with the ``pipeline`` package as code so that
        ``mlflow.pytorch.load_model`` works anywhere. MLflow's pt2 format would need a fixed-length traced
        forward, which a recurrent filter over sequences of any length is not; MLflow therefore stores this
        model with its pickle format. Our own artifacts (checkpoints, tensors) hold plain tensors only (read
        with ``weights_only=True``), and ``pipeline.inference.load_mlflow_run`` rebuilds the model from the
        checkpoint artifact instead. ``epoch``: the epoch of the weights, the logged model's step and ``epoch``
        tag (a run continued to more epochs logs its model again; ``runs:/<id>/model`` is the latest).
        ``units`` (the run's ``data_units.json``): log the model wrapped in a :class:`pipeline.serving.ServedModel`,
        with its MLflow signature, so that ``mlflow.pyfunc.load_model(uri).predict(frame)`` takes and gives data in
        those units (``mlflow.pytorch.load_model(uri).model`` is the model); without, the model alone (which pyfunc
        cannot call)."""
        import torch

        signature = None
        if units is not None:
            from pipeline.serving import ServedModel

            model = ServedModel(model, dict(units))
            signature = model.signature()

        with fluent_tracking_uri(self.mlflow, self.uri), self.mlflow.start_run(run_id=self.run_id, nested=False), \
                _without_pickle_warning():
            self.mlflow.pytorch.log_model(
                model.cpu(), name=name, serialization_format="pickle", signature=signature,
                code_paths=[str(Path(__file__).resolve().parent)],
                pip_requirements=pip_requirements or [f"torch=={torch.__version__.split('+')[0]}"],
                **({} if epoch is None else {"step": int(epoch), "tags": {"epoch": str(int(epoch))}}),
            )

    @_uninterrupted
    def close_stale(self, run_id: str, *, only_if: Mapping[str, str] | None = None) -> None:
        """Mark an earlier run of the same (variant, seed) that a kill left RUNNING as KILLED; with ``only_if``,
        only a run that has those tag values (a run still RUNNING elsewhere, e.g. in a queued experiment's
        copy of the project, is not stale)."""
        _close_stale(self.client, run_id, only_if)

    @_uninterrupted
    def mark_current(self) -> None:
        """Remove what no longer holds of a run continued again: its ``superseded_by`` tag (current once more:
        e.g. its run folder was brought back by ``dvc exp apply`` or a checkout) and the ``failure`` tag of a run
        that failed and trains on, with the note that repeated it (a note of the user's own is kept; a stop now
        says its own). Best effort, as :meth:`supersede`."""
        try:
            tags = self.client.get_run(self.run_id).data.tags
            stale = [k for k in ("superseded_by", "failure") if k in tags]
            if "failure" in tags and tags.get("mlflow.note.content") == tags["failure"]:
                stale.append("mlflow.note.content")
            for key in stale:
                self.client.delete_tag(self.run_id, key)
        except Exception as exc:  # noqa: BLE001
            logging.getLogger(__name__).debug("could not untag MLflow run %s: %s", self.run_id, exc)

    @_uninterrupted
    def supersede(self, run_id: str, *, only_if: Mapping[str, str] | None = None) -> bool:
        """Mark the run ``run_id``, which this run replaces, as superseded: tag ``superseded_by`` = this run's id
        on it and ``supersedes`` = its id on this run (with ``only_if``, only where it has those tag values).
        Best effort: a run that is gone, deleted or in a store that refuses the write is left as it is (logged at
        debug); whether it tagged."""
        if run_id == self.run_id:
            return False
        try:
            old = self.client.get_run(run_id)
            if old.info.lifecycle_stage != "active" or any(old.data.tags.get(k) != v
                                                           for k, v in (only_if or {}).items()):
                return False
            self.client.set_tag(run_id, "superseded_by", self.run_id)
            self.client.set_tag(self.run_id, "supersedes", run_id)
            return True
        except Exception as exc:  # noqa: BLE001 - a lineage tag is not worth a failed run
            logging.getLogger(__name__).debug("could not tag MLflow run %s superseded by %s: %s", run_id,
                                              self.run_id, exc)
            return False

    @_uninterrupted
    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)
