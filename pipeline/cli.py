"""Command line of the pipeline: ``psrnn <stage> ...`` (the DVC stages call ``stages/<stage>.py``, which call
:func:`main`). Every expected failure ends in one line on stderr, ``psrnn <stage>: error: <message>``, naming the
file, key or value, and exit status 1: our own errors (``ValueError``, ``OSError``, ``RuntimeError``, ``KeyError``,
...), and those of the libraries a stage talks to (MLflow's ``MlflowException`` for a tracking URI that is not an
MLflow server or a corrupt store, ``zipfile.BadZipFile``/``zlib.error`` for a damaged archive, ...), recognised by
their module so that mlflow is not imported here. A programming error (``TypeError``, ``AttributeError``, ...)
still shows its traceback. ``--debug`` (before or after the stage name) or ``PSRNN_DEBUG=1`` shows the full
traceback of every failure."""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import logging
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

STAGES = ("download", "preprocess", "features", "two_stage", "decompose", "initialise", "refine", "evaluate",
          "report", "check", "check_params", "predict", "forecast")

#: failures that are the input's or the environment's fault, not a bug: one line, no traceback (MemoryError: sizes
#: that do not fit this machine, e.g. numpy's "Unable to allocate 21.8 TiB for an array ...")
_EXPECTED = (ValueError, OSError, RuntimeError, KeyError, EOFError, ImportError, MemoryError)
_MEMORY_ADVICE = ("expected sizes in params.yaml (n_features, state_dim, lengths ...) that fit this machine's memory "
                  "(psrnn predict / forecast: a smaller --block-rows, --steps or input)")
#: top-level packages whose exceptions are reported in one line (MLflow and its SQL store, HTTP clients, archives,
#: Parquet, YAML); matched by module name so that none of them is imported here
_EXPECTED_MODULES = frozenset({"mlflow", "sqlalchemy", "alembic", "requests", "urllib3", "http", "zipfile", "zlib",
                               "gzip", "tarfile", "pyarrow", "yaml", "json"})
_MAX_MESSAGE = 600


class _OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error in one line like every other failure (the usage is one ``--help`` away)."""

    def __init__(self, *args, **kwargs):
        # an abbreviation (--debu) would parse, then be missed by main's own scan for --debug / --verbose
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="psrnn", description="PSRNN pipeline stages (normally run by `dvc repro`).")
    from pipeline import __version__

    p.add_argument("--version", action="version", version=f"psrnn {__version__}",
                   help="print the version of psrnn-pipeline and exit")
    p.add_argument("--params", default=None, help="params file (default: <project root>/params.yaml)")
    p.add_argument("--root", default=None,
                   help="project root (default: $DVC_ROOT in the workspace, else the nearest folder of params.yaml, "
                        "e.g. the experiment's copy in a queued experiment)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log progress at INFO level (every epoch of every run), wherever the flag is given (also: "
                        "environment variable PSRNN_VERBOSE=1, which reaches the stages of dvc repro)")
    p.add_argument("--debug", action="store_true",
                   help="show the full traceback of a failure, wherever the flag is given (also: environment "
                        "variable PSRNN_DEBUG=1)")
    commands = p.add_subparsers(dest="stage", required=True)
    epilog = "-v/--verbose and --debug also count anywhere (`psrnn --help`)"

    def command(name: str, help: str) -> argparse.ArgumentParser:
        """A subcommand whose ``--help`` shows what it does and the global options, which it also takes after its
        name (SUPPRESS: not given there, the value before the name stands)."""
        sub = commands.add_parser(name, help=help, description=help, epilog=epilog)
        sub.add_argument("--params", default=argparse.SUPPRESS, help="params file (as before the command)")
        sub.add_argument("--root", default=argparse.SUPPRESS, help="project root (as before the command)")
        return sub
    command("check", help="validate params.yaml (and a custom dataset's file against it) and exit")
    command("check_params", help="validate params.yaml as a whole and write artifacts/params_checked (the DVC stage "
                                 "of that name, which depends on every key: a typo in a key no other stage reads "
                                 "fails there)")
    d = command("download", help="fetch and sha256-verify the raw files of a source (mirror when offline)")
    d.add_argument("source", help="ptb, swimmer, mocap or handwriting")
    d = command("preprocess", help="build data/prepared/<dataset>.parquet")
    d.add_argument("dataset", help="dataset section of params.yaml")
    for name, text in (("features", "draw the layer-1 RFF maps"), ("two_stage", "two-stage regression per depth"),
                       ("decompose", "CP decompositions for the factorized ranks"),
                       ("initialise", "initial weights of every model variant")):
        d = command(name, help=text)
        d.add_argument("dataset", help="dataset section of params.yaml")
        d.add_argument("seed", type=int, help="run seed (one of params.yaml seeds)")
    d = command("refine", help="BPTT training of every variant x seed of a dataset (one MLflow run each); "
                                      "runs already trained with the same configuration are skipped (a damaged one "
                                      "is trained again)")
    d.add_argument("dataset", help="dataset section of params.yaml")
    d.add_argument("variant", nargs="?", default=None,
                   help="only this name from <dataset>.variants, e.g. factorized_psrnn_r60 (default: every variant)")
    d.add_argument("seed", nargs="?", type=int, default=None,
                   help="only this run seed, after a variant (default: every seed in params.yaml)")
    d = command("evaluate", help="final metrics (and predictions) of every variant x seed of a dataset, "
                                        "or of one variant's runs (of one seed, when given), a line each")
    d.add_argument("dataset", help="dataset section of params.yaml")
    d.add_argument("variant", nargs="?", default=None,
                   help="only this variant, one line per run (default: every variant, into metrics/ and predictions/)")
    d.add_argument("seed", nargs="?", type=int, default=None,
                   help="only this run seed, after a variant (default: every seed in params.yaml)")
    command("report", help="figures and results.md from every run's outputs")
    d = command("runs", help="list the trained runs (models/<dataset>/<variant>/s<seed>) with their status "
                             "(trained: with the current params, data and code; stale: with others; unchecked: "
                             "what decides it is missing; unfinished: a checkpoint refine resumes; damaged: a "
                             "finished run whose checkpoint or history is unreadable; not trained: "
                             "listed without a run; finished: not listed in params.yaml), last epoch (with "
                             "restore_best, 'N (best B)'), test metric and MLflow run id; not a DVC stage")
    d.add_argument("dataset", nargs="?", default=None, help="only this dataset (default: every one)")
    d.add_argument("--json", action="store_true", help="one JSON object per run, one per line, instead of the table")
    d = command("custom-stage", help="print the dvc.yaml stage that prepares a custom_<name> dataset (the "
                                           "shipped preprocess_custom, renamed); append it with >> dvc.yaml")
    d.add_argument("name", help="the dataset: custom_<name>, a section of params.yaml")
    d = command("compare", help="compare a report summary (default: reports/summary.json) with a reference "
                                "snapshot (default: docs/reference/default), number by number; not a DVC stage")
    d.add_argument("summary", nargs="?", default=None,
                   help="the summary.json to check, or a folder holding one (default: <project root>/reports/"
                        "summary.json)")
    d.add_argument("--reference", default=None,
                   help="the summary to compare with: a file, a folder holding summary.json, or the name of a "
                        "snapshot in docs/reference/ (default, continuous-lr, ptb-40-epochs, and the Intel Xeon "
                        "snapshot's default-xeon-61beb63 and continuous-lr-xeon-61beb63; default: default)")
    d.add_argument("--rtol", type=float, default=None,
                   help="relative difference up to which two numbers are 'close', in [1e-6, 1) (default 1e-3: how "
                        "far the epoch-0 metrics moved between two CPUs)")
    d.add_argument("--all", action="store_true", dest="show_all",
                   help="list every number compared (default: those that are not the same)")
    d.add_argument("--check", action="store_true",
                   help="exit with status 1 when a number differs beyond its seed spread, a variant is on one "
                        "side only, or the two summaries share no dataset (default: 0 whatever the verdicts); "
                        "2, with or without --check, when the summaries cannot be read")
    for name, text, out in (
            ("predict", "one-step predictions of a trained run on new trajectories (a Parquet file in the schema "
                        "of a custom dataset); not a DVC stage",
             "Parquet file to write (CSV for a name ending in .csv): one row per input row, the prediction of the next "
             "observation"),
            ("forecast", "free-running forecasts of the next --steps observations after each trajectory of a "
                         "Parquet file (each prediction fed back as the next input); not a DVC stage",
             "Parquet file to write (CSV for a name ending in .csv): one row per trajectory and horizon 1..steps")):
        d = command(name, help=text)
        d.add_argument("dataset", help="the dataset the run was trained on, e.g. swimmer or custom")
        d.add_argument("variant", help="the run's model variant, e.g. psrnn")
        d.add_argument("run_seed", metavar="seed", type=int, help="the run's seed")
        d.add_argument("input", help="Parquet file: trajectory, optional step, and the symbol column (discrete) or "
                                     "the feature columns the model was trained on (continuous), in their original "
                                     "units")
        d.add_argument("output", help=out + " (README, 'Using a trained model on new data')")
        if name == "forecast":
            d.add_argument("--steps", type=int, required=True,
                           help="how many observations to forecast (1 to 1000000)")
            d.add_argument("--sample", action="store_true",
                           help="discrete data: feed back symbols drawn from the predicted distribution (default: "
                                "the most likely symbol)")
            d.add_argument("--sample-seed", type=int, default=None,
                           help="seed of --sample's draws, 0 <= seed < 2**32 (default 0); only with --sample")
            d.add_argument("--score", action="store_true",
                           help="hold out the last --steps rows of every trajectory, forecast them from the rows "
                                "before, and score the forecasts against them and against forecasts of no dynamics "
                                "(the last value repeated; the training mean, or the most frequent symbol); the "
                                "output: the held-out rows, observed_<feature> (or observed) beside each forecast; "
                                "trajectories of --steps rows or fewer are left out")
        else:
            d.add_argument("--block-rows", type=int, default=65536,
                           help="rows filtered and written at a time (one Parquet row group each; default 65536): "
                                "memory does not grow with the input beyond the input itself")
        d.add_argument("--initial", action="store_true",
                       help="use the run's initial (epoch 0: 2SR or random) weights instead of the trained ones")
        # discrete-only options default to None, so that giving one for a continuous run is refused
        d.add_argument("--symbol-column", default=None,
                       help="discrete data: the input's symbol column (default: the column the run's training "
                            "data had its symbols in, source.symbol_column; symbol for the built-in sets)")
        d.add_argument("--unknown", choices=("error", "drop", "map"), default=None,
                       help="discrete data: a symbol not in the training vocabulary is an error (default), is "
                            "dropped, or is mapped to <unk> (a vocabulary that has one, e.g. ptb with unknown: map)")
        d.add_argument("--probabilities", action="store_true",
                       help="discrete data: also write every symbol's probability (a list column, vocabulary "
                            "order; Parquet outputs only)")
        d.add_argument("--device", default="auto",
                       help="auto (default: CUDA when present, as train.device), cpu, cuda or cuda:<index>")
    return p


def _command_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The sub-parser of command ``name``, so that a usage error names ``psrnn <name>`` and its ``--help``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


class _LogFormatter(logging.Formatter):
    """The library's log records as the command's own lines: a warning as ``psrnn <stage>: warning: ...``, like the
    warnings the commands print themselves (it read ``WARNING pipeline.data.custom: ...``); ``-v``'s progress
    lines keep the module that wrote them (``INFO pipeline.workflow.refine: ...``)."""

    def __init__(self, stage: str):
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.stage = stage

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno < logging.WARNING:
            return super().format(record)
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return f"psrnn {self.stage}: {record.levelname.lower()}: {text}"


#: the commands that write no file (a stop leaves nothing to say about files)
_READ_ONLY_COMMANDS = ("compare", "runs", "check", "check_params", "custom-stage")


def _stop_note(stage: str) -> str:
    """What a Ctrl-C or SIGTERM left: nothing half-written (every artifact is renamed into place), and where
    refine picks up again."""
    if stage in _READ_ONLY_COMMANDS:
        return ""
    return "; no half-written file is left" + (" (refine resumes from its last checkpoint)" if stage == "refine"
                                                else "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug and -v count anywhere, also after the stage name (the stage scripts put the stage name first)
    def verbose(a: str) -> bool:   # -vv is -v twice to argparse
        return a == "--verbose" or (len(a) > 1 and a == "-" + "v" * (len(a) - 1))

    parser = build_parser()
    args, extra = parser.parse_known_args([a for a in argv if a != "--debug" and not verbose(a)])
    if extra:   # argparse would name `psrnn`, whose --help does not list the command's flags
        _command_parser(parser, args.stage).error(f"unrecognized arguments: {' '.join(extra)}")
    args.debug = "--debug" in argv
    # PSRNN_VERBOSE=1 dvc repro: the stages' command lines are dvc.yaml's, so the flag cannot reach them there
    args.verbose = any(verbose(a) for a in argv) or _env_flag("PSRNN_VERBOSE")
    handler = logging.StreamHandler()
    handler.setFormatter(_LogFormatter(args.stage))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    from pipeline.config import project_root

    root = Path(args.root).resolve() if args.root else project_root()
    params_path = Path(args.params) if args.params else root / "params.yaml"
    from pipeline.messages import command_options

    with _terminate_cleanly(), command_options(args.root, args.params):
        status = _run(args, root, params_path)
    try:
        sys.stdout.flush()   # `psrnn check | head -1`: the reader may be gone before the buffer's last write
    except BrokenPipeError:
        return _reader_gone()
    return status


def _reader_gone() -> int:
    """The reader of stdout closed the pipe (``| head``): stop quietly with the status of a process killed by
    SIGPIPE, as a Unix tool would, instead of a "Broken pipe" error; stdout goes to /dev/null so that the
    interpreter's own flush at exit does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):   # no file descriptor (in-process)
        pass
    return 128 + int(getattr(signal, "SIGPIPE", 13))


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on its write end): a broken
    pipe of a socket or a subprocess is an error like any other, not a reader that has read enough."""
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


class Terminated(BaseException):
    """SIGTERM (a scheduler's or ``kill``'s stop), raised like Ctrl-C so that ``finally`` blocks run: temporary
    files are removed and the MLflow run is closed as KILLED, rather than the process vanishing mid-write."""


@contextlib.contextmanager
def _terminate_cleanly():
    if threading.current_thread() is not threading.main_thread():   # signal handlers belong to the main thread
        yield
        return

    def handler(signum, frame):
        from pipeline.io import raise_or_hold

        raise_or_hold(Terminated())   # not in the middle of an MLflow write (pipeline.tracking holds it off)

    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _run(args: argparse.Namespace, root: Path, params_path: Path) -> int:
    from pipeline.config import ParamsError, load_params

    params = None
    try:
        if args.stage == "compare":   # two JSON files: no params.yaml needed
            return _compare(args, root)
        if root.exists() and not root.is_dir():
            raise ParamsError(f"{root}: --root names a file; expected the project's folder (the one holding "
                              "params.yaml and dvc.yaml)")
        if not params_path.exists():
            if args.params:
                raise ParamsError(f"{params_path}: params file not found (--params); expected an existing file")
            raise ParamsError(f"{params_path}: params file not found; expected to run inside a project (or give "
                              "--root DIR or --params FILE)")
        params = load_params(params_path)
        # what validating params.yaml imported, before the stage's own work (only when tracing imports)
        validation = _project_files() if os.environ.get("PSRNN_TRACE_IMPORTS") else set()
        seed = getattr(args, "seed", None)
        if seed is not None and seed not in params.seeds:
            raise ParamsError(f"seed {seed} is not in {params_path.name if args.params else 'params.yaml'} seeds "
                              f"{params.seeds}")
        status = _dispatch(args, params, root)
        _trace_imports(args.stage, validation)
        return status
    except KeyboardInterrupt:
        print(f"psrnn {args.stage}: interrupted (Ctrl-C){_stop_note(args.stage)}", file=sys.stderr)
        return 130
    except Terminated:
        print(f"psrnn {args.stage}: terminated (SIGTERM){_stop_note(args.stage)}", file=sys.stderr)
        return 128 + signal.SIGTERM
    except Exception as exc:  # one clear line, not a traceback, for every expected failure
        if isinstance(exc, BrokenPipeError) and not _debug(args) and _stdout_reader_gone():
            return _reader_gone()
        if _debug(args) or not expected_failure(exc):
            raise
        message = one_line(exc)
        sizes = _size_keys(params, args.stage, getattr(args, "dataset", None)) if out_of_memory(exc) \
            else ""
        if sizes:   # name the keys of this stage's sizes rather than the generic list
            message = message.replace(_MEMORY_ADVICE, f"expected sizes that fit this machine's memory: {sizes}")
        print(f"psrnn {args.stage}: error: {message}", file=sys.stderr)
        # compare --check is 1 when the numbers differ: trouble is 2, as diff and cmp say it (argparse's too)
        return 2 if args.stage == "compare" else 1


#: per stage, the parts of a dataset's params section, and their keys, whose values decide the stage's memory
_STAGE_SIZES = {
    "preprocess": (("source", ("length", "n_train", "n_test", "n_trajectories", "state_dim", "obs_dim", "n_states",
                               "n_symbols")),),
    **{stage: (("two_stage", ("n_features", "state_dim", "obs_dim", "past_dim", "past_window", "future_window",
                              "layers")),) for stage in ("features", "two_stage", "decompose", "initialise")},
    **{stage: (("two_stage", ("n_features", "state_dim", "obs_dim", "layers")), ("train", ("batch_size", "bptt")))
       for stage in ("refine", "evaluate")},
}


def _size_keys(params: Any, stage: str, dataset: Any) -> str:
    """For an out-of-memory error of a dataset's stage, the keys of params.yaml that size it, with their values
    ("swimmer.two_stage.n_features = 100000, swimmer.two_stage.state_dim = 20, ..."); "" when none is set."""
    raw = getattr(params, "raw", None)
    section = raw.get(dataset) if isinstance(raw, dict) and isinstance(dataset, str) else None
    if not isinstance(section, dict):
        return ""
    keys = []
    for part, names in _STAGE_SIZES.get(stage, ()):
        values = section.get(part)
        if isinstance(values, dict):
            keys += [f"{dataset}.{part}.{k} = {values[k]}" for k in names if k in values]
            overrides = values.get("overrides") if part == "train" else None
            for variant, setting in (overrides.items() if isinstance(overrides, dict) else ()):
                if isinstance(setting, dict):   # a variant's own batch size or BPTT sizes its runs instead
                    keys += [f"{dataset}.train.overrides.{variant}.{k} = {setting[k]}" for k in names if k in setting]
    return ", ".join(keys)


def _compare(args: argparse.Namespace, root: Path) -> int:
    from pipeline.compare import compare_summaries, format_comparison, load_summary, resolve_summary

    ours = resolve_summary(args.summary, root, reference=False)
    reference = resolve_summary(args.reference, root, reference=True)
    rtol = {} if args.rtol is None else {"rtol": args.rtol}
    result = compare_summaries(load_summary(ours), load_summary(reference, reference=True), **rtol)

    def shown(path: Path) -> str:   # relative to the project where it is inside, as a user would type it
        try:
            return str(path.resolve().relative_to(root))
        except ValueError:
            return str(path)
    print(format_comparison(result, shown(ours), shown(reference), show_all=args.show_all), end="")
    return 1 if args.check and not (result.rows and result.agrees) else 0   # nothing compared: nothing held


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _debug(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or _env_flag("PSRNN_DEBUG")


def _library(exc: BaseException) -> str | None:
    """The top-level package of the first class in ``exc``'s MRO that comes from a library we report in one line."""
    for cls in type(exc).__mro__:
        top = (cls.__module__ or "").split(".")[0]
        if top in _EXPECTED_MODULES:
            return top
    return None


def expected_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the input or environment (one line) rather than a bug (traceback)."""
    return isinstance(exc, _EXPECTED) or _library(exc) is not None


def out_of_memory(exc: BaseException) -> bool:
    """numpy's MemoryError, or torch's (CUDA) OutOfMemoryError, a RuntimeError matched by name so that torch is
    not imported here."""
    return isinstance(exc, MemoryError) or any(c.__name__ == "OutOfMemoryError" for c in type(exc).__mro__)


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: whitespace collapsed, an OSError's "[Errno N]" left out, shortened to a few hundred
    characters; a library's exception (e.g. ``MlflowException``) is prefixed with its class name, and a
    message-less one is its class name."""
    text = " ".join(str(exc).split())
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        text = " ".join(str(exc.args[0]).split())
    if isinstance(exc, OSError) and exc.errno is not None:   # "[Errno 2] " tells a user nothing the text does not
        text = text.removeprefix(f"[Errno {exc.errno}] ")
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE - 3].rstrip() + "..."
    if out_of_memory(exc):
        return f"out of memory{': ' + text if text else ''}; {_MEMORY_ADVICE}"
    name = type(exc).__name__
    if not text:
        return name
    if _library(exc) is not None and not isinstance(exc, (ValueError, OSError)):
        return f"{name}: {text}"
    return text


def _dispatch(args: argparse.Namespace, params, root: Path) -> int:
    import importlib

    stage = args.stage
    # each stage imports only its own workflow module: dvc.yaml lists exactly the code a stage runs
    if stage in ("predict", "forecast"):
        (_predict if stage == "predict" else _forecast)(args, root, params)
        return 0
    if stage == "custom-stage":
        print(_custom_stage_text(root, params, args.name), end="")
        return 0
    if stage == "runs":
        from pipeline.workflow.runs import format_runs, list_runs

        rows = list_runs(params, root, args.dataset)
        if args.json:
            import json
            import math

            def plain(v):   # JSON has no NaN: a metric that is not finite is null
                return None if isinstance(v, float) and not math.isfinite(v) else v

            print("".join(json.dumps({k: plain(v) for k, v in r.items()}) + "\n" for r in rows), end="")
        else:
            print(format_runs(rows, args.dataset, args.dataset is None or args.dataset in params.selected), end="")
        return 0
    module = {"check": None, "check_params": None, "download": "data", "preprocess": "data", "features": "spectral",
              "two_stage": "spectral", "decompose": "spectral", "initialise": "initialise", "refine": "refine",
              "evaluate": "evaluate", "report": "report"}[stage]
    wf = importlib.import_module(f"pipeline.workflow.{module}") if module else None
    calls: dict[str, Callable[[], object]] = {
        "check": lambda: _check(args, params, root),
        "check_params": lambda: _params_checked(root, params),
        "download": lambda: wf.download(params, root, args.source),
        "preprocess": lambda: wf.prepare(params, root, args.dataset),
        "features": lambda: wf.features(params, root, args.dataset, args.seed),
        "two_stage": lambda: wf.two_stage(params, root, args.dataset, args.seed),
        "decompose": lambda: wf.decompose(params, root, args.dataset, args.seed),
        "initialise": lambda: wf.initialise(params, root, args.dataset, args.seed),
        "refine": lambda: (wf.refine(params, root, args.dataset) if args.variant is None
                           else [print(wf.summary_line(h)) for h in
                                 wf.refine(params, root, args.dataset, args.variant, args.seed).values()]),
        "evaluate": lambda: (wf.evaluate_dataset(params, root, args.dataset) if args.variant is None
                             else [print(wf.summary_line(wf.evaluate_run(params, root, args.dataset, args.variant, s)))
                                   for s in ([args.seed] if args.seed is not None else params.seeds)]),
        "report": lambda: wf.report(params, root),
    }
    if stage in ("refine", "evaluate") and args.variant is not None:
        params.dataset(args.dataset).variant(args.variant)
    calls[stage]()
    return 0


def _check_inference_args(args: argparse.Namespace, root: Path) -> None:
    """What ``psrnn predict`` / ``forecast`` can check of their arguments before loading anything: the device and
    the output path (``--steps`` and ``--sample-seed`` of forecast)."""
    from pipeline.inference import check_block_rows, check_output_path, check_seed, check_steps
    from pipeline.train import resolve_device

    if args.stage == "forecast":
        check_steps(args.steps, "--steps")
        if args.sample_seed is not None:
            if not args.sample:   # the greedy forecast draws nothing: a seed there is a forgotten --sample
                raise ValueError(f"--sample-seed {args.sample_seed}: only used with --sample (the default "
                                 "forecast feeds back the most likely symbol and draws nothing)")
            check_seed(args.sample_seed, "--sample-seed")
    else:
        check_block_rows(args.block_rows, "--block-rows")
    resolve_device(args.device, "--device")
    for name, path in (("input", args.input), ("output", args.output)):
        if path == "-":   # a file of that name would be read or written, not standard input or output
            raise ValueError(f"{name} -: {args.stage} reads and writes Parquet or CSV files, not standard input or "
                             f"output; expected a path (./- for a file named -)")
    check_output_path(args.output, root)   # not over the project's own files, before the run is loaded
    suffix = Path(args.output).suffix
    if suffix.lower() not in (".parquet", ".csv"):   # a .txt name would not make text: say so, not surprise a reader
        print(f"psrnn {args.stage}: warning: {args.output}: written as Parquet (pyarrow), whatever its name ends with "
              f"({suffix or 'no suffix'}); expected a name ending in .parquet (or .csv for CSV)", file=sys.stderr)


def _discrete_options(args: argparse.Namespace, run) -> dict[str, Any]:
    """The discrete-only options for ``run``, their defaults filled in; given for a continuous run, an error."""
    if not run.discrete:
        given = [flag for flag, value in (("--symbol-column", args.symbol_column), ("--unknown", args.unknown),
                                          ("--probabilities", args.probabilities or None),
                                          ("--sample", getattr(args, "sample", False) or None))
                 if value is not None]
        if given:
            raise ValueError(f"{given[0]}: applies to discrete runs only; {args.dataset} {args.variant} seed "
                             f"{args.run_seed} is a continuous run (features {', '.join(run.features)})")
    return {"symbol_column": args.symbol_column,   # None: the run's own (TrainedRun.symbol_column)
            "unknown": args.unknown if args.unknown is not None else "error", "probabilities": args.probabilities}


def _warn_if_stale(args: argparse.Namespace, root: Path, params) -> None:
    """``predict`` and ``forecast`` use a finished run as it is (a model trained on older params may be just what
    is wanted), but say so on stderr when its params, data, initial weights or training code are not the current
    ones, which ``evaluate`` refuses (:func:`pipeline.workflow.evaluate.check_current`), or when a custom dataset's
    file changed since it was prepared (:func:`pipeline.workflow.runs.source_changed`). Runs of a dataset, variant
    or seed that the params no longer list, and ``--initial`` weights, are not compared."""
    from pipeline.workflow.evaluate import check_current

    if args.initial or args.dataset not in params.datasets or args.run_seed not in params.seeds:
        return
    if args.variant not in [v.name for v in params.dataset(args.dataset).variants]:
        return
    from pipeline.inference import recorded_units
    from pipeline.workflow.paths import model_dir

    try:
        check_current(params, root, args.dataset, args.variant, args.run_seed)
    except RuntimeError as exc:
        units = ("" if recorded_units(model_dir(root, args.dataset, args.variant, args.run_seed)) is not None else
                 ", in the units of the current prepared data (the run predates runs that keep their own)")
        print(f"psrnn {args.stage}: warning: {one_line(exc)}; using it as it is{units}", file=sys.stderr)
    except (OSError, ValueError) as exc:   # what the comparison reads is gone or unreadable: the run is still used
        print(f"psrnn {args.stage}: warning: could not compare the run with the current params and data "
              f"({one_line(exc)}); using it as it is", file=sys.stderr)
    else:   # current against the prepared file, which a later edit of a custom file has not reached yet
        from pipeline.workflow.runs import source_changed

        changed = source_changed(params, root, args.dataset)
        if changed:
            print(f"psrnn {args.stage}: warning: {changed}; using it as it is", file=sys.stderr)


def _load_run(args: argparse.Namespace, root: Path, params):
    """The run ``predict`` / ``forecast`` use (:func:`pipeline.inference.load_run`); a run not found of a dataset
    that params.yaml's ``datasets`` leaves out says so: `dvc repro` trains none of its runs, whatever has run."""
    from pipeline.inference import load_run

    try:
        return load_run(root, args.dataset, args.variant, args.run_seed, initial=args.initial)
    except FileNotFoundError as exc:
        if args.dataset in params.selected:
            raise
        why = ("has a section but is not in params.yaml's datasets" if args.dataset in params.datasets else
               "has no section in params.yaml")
        raise FileNotFoundError(f"{one_line(exc)}; {args.dataset} {why}, so `dvc repro` trains none of its runs "
                                f"(datasets: {', '.join(params.selected)})") from None


def _predict(args: argparse.Namespace, root: Path, params) -> None:
    """``psrnn predict``: :func:`pipeline.inference.predict_file`, and one line of what was written."""
    from pipeline.inference import predict_file

    _check_inference_args(args, root)
    run = _load_run(args, root, params)
    _warn_if_stale(args, root, params)
    summary = predict_file(run, Path(args.input), Path(args.output), **_discrete_options(args, run),
                           device=args.device, block_rows=args.block_rows)
    _warn_far(args, summary)
    m = summary["metrics"]
    shown = ", ".join(f"{k} {v:.4g}" for k, v in m.items() if v == v)
    scored = (f"one-step {shown} over {summary['predicted_steps']} steps" if shown and summary["predicted_steps"]
              else "nothing scored (no trajectory has a next observation to compare a prediction with)")
    dropped = _dropped(summary["dropped"], summary["emptied"])
    n = summary["trajectories"]
    print(f"{args.output}: {_count(summary['rows'], 'prediction')} for {n} "
          f"trajector{'y' if n == 1 else 'ies'}{dropped} "
          f"({args.dataset} {args.variant} seed {args.run_seed}, epoch {run.epoch}); {scored}")


def _warn_far(args: argparse.Namespace, summary: dict) -> None:
    """Inputs far outside the training data (other units?), and predictions worse than a predictor of no
    dynamics, are said on stderr: the output is written."""
    for key in ("far_from_training", "worse_than_naive"):
        if summary.get(key):
            print(f"psrnn {args.stage}: warning: {args.input}: {summary[key]}", file=sys.stderr)


def _dropped(n: int, emptied: Sequence[Any] = ()) -> str:
    """How the summary line says what ``--unknown drop`` left out: rows, and the trajectories of nothing but
    unknown symbols, which are left out whole (the count of trajectories would hide them)."""
    if not n:
        return ""
    gone = ""
    if emptied:
        from pipeline.messages import listed

        gone = f" (trajector{'y' if len(emptied) == 1 else 'ies'} {listed(emptied)} left out: every symbol unknown)"
    return f", {n} unknown-symbol row{'' if n == 1 else 's'} dropped{gone}"


def _forecast(args: argparse.Namespace, root: Path, params) -> None:
    """``psrnn forecast``: :func:`pipeline.inference.forecast_file`, and one line of what was written."""
    from pipeline.inference import forecast_file

    _check_inference_args(args, root)
    run = _load_run(args, root, params)
    _warn_if_stale(args, root, params)
    summary = forecast_file(run, Path(args.input), Path(args.output), steps=args.steps, sample=args.sample,
                            seed=args.sample_seed or 0, **_discrete_options(args, run), device=args.device,
                            score=args.score)
    _warn_far(args, summary)
    n = summary["trajectories"]
    dropped = _dropped(summary["dropped"], summary["emptied"])
    what = "forecasts of the held-out last steps" if args.score else "forecasts"
    print(f"{args.output}: {summary['steps']}-step {what} of {n} trajector{'y' if n == 1 else 'ies'}{dropped} "
          f"({args.dataset} {args.variant} seed {args.run_seed}, epoch {run.epoch})" + _forecast_scores_text(summary))
    if summary.get("too_short"):
        from pipeline.messages import listed

        short = summary["too_short"]
        print(f"note: {len(short)} trajector{'y' if len(short) == 1 else 'ies'} of {args.steps} rows or fewer left "
              f"out ({listed(short)}): nothing before the held-out rows to forecast them from", file=sys.stderr)
    single = summary.get("single_row")
    if single:
        k = single["trajectories"]
        source = ("the median of the other trajectories'" if single["measured_from"] else
                  "no trajectory has two rows to measure it from")
        print(f"note: {k} single-row trajector{'y' if k == 1 else 'ies'}, whose step spacing is unknown, "
              f"continued at spacing {single['spacing']} ({source})", file=sys.stderr)


def _forecast_scores_text(summary: dict) -> str:
    """'; scored: mse ... (repeating the last value: ...), by horizon 1 ..., 30 ...' for ``forecast --score``."""
    m = summary.get("metrics")
    if not m:
        return ""
    key = "mse" if "mse" in m else "accuracy"
    h = m[f"{key}_by_horizon"]
    horizons = ", ".join(f"{i} {h[i - 1]:.4g}" for i in dict.fromkeys((1, (len(h) + 1) // 2, len(h))))
    last = "the last value repeated" if key == "mse" else "the last symbol repeated"
    naive = [f"{what} {m[k]:.4g}" for k, what in (("last_value_" + key, last),
                                                  ("train_mean_mse", "the training mean"),
                                                  ("unigram_accuracy", "the most frequent training symbol"))
             if k in m]
    units = f" (data units {m['mse_data_units']:.4g})" if key == "mse" and m["mse_data_units"] != m["mse"] else ""
    return f"; scored: {key} {m[key]:.4g}{units} against {', '.join(naive)}; by horizon {horizons}"


def _check(args: argparse.Namespace, params, root: Path) -> None:
    """``psrnn check``: params.yaml is valid (it was parsed before dispatch); a custom dataset's file is read and
    checked against the params too, as its preprocess stage will, and dvc.yaml must have the stage that prepares
    it; a built-in dataset in ``datasets`` whose prepared file exists has its windows (the Kalman filter's too)
    checked against that file; spectral work no variant uses is noted, and so are sections that ``datasets``
    leaves out."""
    from pipeline.config import is_custom
    from pipeline.workflow.data import check_custom, check_prepared, untracked_note

    selected = [params.datasets[name] for name in params.selected]
    has_valid: dict[str, bool] = {}   # a custom file's, known once it is read
    for name in params.datasets:
        if is_custom(name):
            summary, has_valid[name] = check_custom(params, root, name)
            print(summary)
    for name in params.selected:
        # a built-in dataset's data are known only once prepared (a download and minutes away): checked then
        summary = None if is_custom(name) else check_prepared(params, root, name)
        if summary is not None:
            print(summary)
    _check_dvc_yaml(root, params)
    from pipeline.workflow.refine import check_devices

    for dp in selected:   # a device this machine lacks: refine would stop on it after the spectral stages
        check_devices(dp, [v.name for v in dp.variants])
    print(f"{args.params or root / 'params.yaml'}: valid ({_count(len(selected), 'dataset')}: "
          f"{', '.join(params.selected)}; "
          f"{_count(sum(len(d.variants) for d in selected), 'model variant')}, seeds {list(params.seeds)})")
    for dp in selected:
        untracked = untracked_note(params, root, dp.name) if is_custom(dp.name) else None
        for note in [*dp.unused_spectral_work(), *dp.schedule_notes(has_valid.get(dp.name)),
                     *([untracked] if untracked else [])]:
            print(f"note: {note}")
    left_out = [name for name in params.datasets if name not in params.selected]
    if left_out:
        print(f"note: {', '.join(left_out)} {'has a section' if len(left_out) == 1 else 'have sections'} but "
              f"{'is' if len(left_out) == 1 else 'are'} not in datasets: not trained or reported "
              f"(a plain `dvc repro` still prepares {'its' if len(left_out) == 1 else 'their'} data where dvc.yaml "
              f"has {'its' if len(left_out) == 1 else 'their'} preprocess stage; `dvc repro report` does not)")


#: what the check_params stage writes: always the same bytes, so that a params edit reruns the stage and nothing that
#: depends on its output (the report)
PARAMS_CHECKED = Path("artifacts") / "params_checked"


def _params_checked(root: Path, params) -> None:
    """``psrnn check_params``: params.yaml was validated as a whole before dispatch (every key, known or not, of
    every section); say so in :data:`PARAMS_CHECKED`. The stage of that name depends on the whole file, so an
    edit that no other stage reads (``hmm.overrides`` for ``hmm.train.overrides``, a key at the top) reruns it
    and fails there, instead of changing nothing under a successful ``dvc repro``. Two checks of ``psrnn check``
    that need no data come first, since DVC's own messages name a stage rather than the key: what dvc.yaml reads
    of params.yaml (:func:`_check_dvc_yaml`: a custom section without ``model:`` stopped ``initialise``), and
    that each custom section's ``source.path`` names a file (a typo stopped its preprocess stage on a missing
    dependency; a section that ``datasets`` leaves out is not read by ``dvc repro report``, and not checked)."""
    from pipeline.config import is_custom
    from pipeline.io import write_text

    _check_dvc_yaml(root, params)
    for name in params.selected:
        if not is_custom(name):
            continue
        path = Path(params.dataset(name).source["path"])
        full = path if path.is_absolute() else root / path
        if not full.is_file():
            what = "is a directory; expected a single Parquet file" if full.is_dir() else "file not found"
            raise FileNotFoundError(f"{name}.source.path: {path}: {what} (relative paths are read from the project "
                                    f"root {root})")

    write_text(root / PARAMS_CHECKED, "params.yaml: valid (psrnn check_params)\n")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _check_dvc_yaml(root: Path, params) -> None:
    """What dvc.yaml, where there is one, needs of params.yaml: its stages iterate over ``datasets``, so the key
    must be there (DVC's own message names only the unresolved ``${datasets}``); every dataset of your own that
    ``datasets`` lists needs its ``preprocess_<name>`` stage (``preprocess_custom`` ships with dvc.yaml, one for
    ``custom_<name>`` is a copy of it), else ``dvc repro`` stops later on a missing
    ``data/prepared/<name>.parquet``; a copy must name the new dataset everywhere it named ``custom``."""
    from pipeline.config import is_custom

    path = root / "dvc.yaml"
    if not path.exists():   # params checked outside a DVC project
        return
    _, stages = _read_dvc_yaml(path)
    other_files: dict[str, Any] = {}
    for file, key, where in _dvc_yaml_params(stages, params.raw):
        if file is not None:   # a `{file: [keys]}` entry naming a params file of your own
            _check_params_file(root, path, file, key, where, other_files)
            continue
        if _lookup(params.raw, key) is not _MISSING:
            continue
        if key == "datasets":   # the library defaults it (all sections), so say what to write
            raise ValueError(f"datasets: required, {path} iterates over it; expected the datasets to run, e.g. "
                             f"datasets: [{', '.join(params.datasets)}]")
        none = " (`kf: null` for no Kalman filter)" if key.endswith(".kf") else ""
        raise ValueError(f"{key}: required, {path} {where}; expected it in params.yaml{none} (the shipped "
                         "params.yaml has every key dvc.yaml reads)")
    for name in params.selected:
        if not is_custom(name):
            continue
        stage = stages.get(f"preprocess_{name}")
        if not isinstance(stage, dict):
            shipped = ("the one dvc.yaml ships with" if name == "custom" else
                       f"the one `python -m pipeline.cli custom-stage {name} >> dvc.yaml` appends")
            raise ValueError(f"datasets: lists {name}, but {path} has no preprocess_{name} stage to prepare its "
                             f"file; expected {shipped} (README, 'Adding your own dataset')")
        if name != "custom" and isinstance(stages.get("preprocess_custom"), dict):
            wanted = custom_stage(stages["preprocess_custom"], name)
            for field in ("cmd", "deps", "params", "outs"):
                if stage.get(field) != wanted[field]:
                    raise ValueError(f"{path}: stage preprocess_{name}: {field} is {stage.get(field)!r}; expected "
                                     f"{wanted[field]!r}, as `python -m pipeline.cli custom-stage {name}` prints it")


_MISSING = object()
_REFERENCE = re.compile(r"\$\{\s*([^}]+?)\s*\}")


def _lookup(raw: Any, key: str) -> Any:
    """The value of the dotted ``key`` in the params mapping ``raw`` (DVC's reading of a param name), or
    ``_MISSING``."""
    for part in key.split("."):
        if not isinstance(raw, dict) or part not in raw:
            return _MISSING
        raw = raw[part]
    return raw


def dvc_references(value: Any) -> Iterator[str]:
    """The ``${...}`` references in a dvc.yaml value (a string, or the strings of nested mappings and lists)."""
    if isinstance(value, str):
        yield from _REFERENCE.findall(value)
    elif isinstance(value, dict):
        for v in value.values():
            yield from dvc_references(v)
    elif isinstance(value, list):
        for v in value:
            yield from dvc_references(v)


def _dvc_yaml_params(stages: dict[str, Any], raw: dict[str, Any]):
    """(file, key, where) for every params key that the ``stages`` of dvc.yaml read: the ``${...}`` their
    ``foreach`` / ``matrix`` iterate over or their fields interpolate, and each param they declare, expanded over
    the iteration (``${item}``, ``${item.<name>}``) as DVC expands it. ``file`` is None for params.yaml, else the
    file a ``{file: [keys]}`` entry names (``key`` None where the entry tracks the whole file) and ``where`` only
    the stage. DVC stops on any of them missing, for every stage of the file, with a message that names the stage
    rather than the key."""
    def resolve(value: Any) -> Any:
        if isinstance(value, str):
            whole = _REFERENCE.fullmatch(value.strip())
            if whole:
                found = _lookup(raw, whole.group(1))
                return [] if found is _MISSING else found
        return value

    for name, stage in stages.items():
        if not isinstance(stage, dict):
            continue
        if "foreach" in stage:
            items = resolve(stage["foreach"])
            body = stage.get("do") or {}
        elif "matrix" in stage:
            axes = {k: resolve(v) for k, v in (stage["matrix"] or {}).items()}
            items = [dict(zip(axes, combo)) for combo in itertools.product(*(
                v if isinstance(v, list) else [v] for v in axes.values()))]
            body = stage
        else:
            items, body = [None], stage
        for ref in dvc_references({k: v for k, v in stage.items() if k in ("foreach", "matrix")}):
            yield None, ref, f"iterates over it in stage {name}"
        for ref in dvc_references({k: v for k, v in body.items() if k != "params"}):
            if not ref.startswith("item"):
                yield None, ref, f"interpolates it in stage {name}"
        if not isinstance(items, (list, dict)):
            continue
        for item in items if isinstance(items, list) else list(items):
            def expand(text: str, item=item) -> str:
                return _REFERENCE.sub(lambda m: _item_value(item, m.group(1)), text)

            at = ("" if item is None else f"@{item}" if not isinstance(item, dict)
                  else "@" + "-".join(str(v) for v in item.values()))   # DVC's name of the stage
            stage_name = f"stage {name}{at}"
            for entry in body.get("params") or []:
                if isinstance(entry, str):
                    entries = {"params.yaml": [entry]}
                elif isinstance(entry, dict):   # {file: [keys]}; {file: null} tracks the whole file
                    entries = entry
                else:
                    continue
                for file, keys in entries.items():
                    file = expand(str(file))
                    if "${" in file:   # an interpolation DVC itself resolves or refuses
                        continue
                    file = None if Path(file) == Path("params.yaml") else file
                    keys = [] if keys is None else keys if isinstance(keys, list) else [keys]
                    if file is not None and not keys:
                        yield file, None, stage_name
                    for key in map(expand, map(str, keys)):
                        if "${" not in key:
                            yield file, key, (f"declares it as a param of {stage_name}" if file is None
                                              else stage_name)


def _check_params_file(root: Path, dvc_yaml: Path, file: str, key: str | None, stage: str,
                       loaded: dict[str, Any]) -> None:
    """A ``{file: [keys]}`` params entry of dvc.yaml: the file must exist (DVC fails on it missing) and, where it
    is YAML or JSON, hold ``key``. ``loaded`` caches the files read, by name."""
    import json

    from pipeline.config import YAMLError, read_yaml

    target = root / file
    if not target.is_file():
        raise ValueError(f"{file}: not found, {dvc_yaml} declares it as a params file of {stage}; expected that "
                         f"file (relative to {root})")
    if key is None or target.suffix.lower() not in (".yaml", ".yml", ".json"):
        return   # TOML or Python params files are DVC's to read
    if file not in loaded:
        try:
            text = target.read_text()
            loaded[file] = json.loads(text) if target.suffix.lower() == ".json" else read_yaml(text)
        except (OSError, ValueError, YAMLError) as exc:
            raise ValueError(f"{target}: cannot read it as a params file: {' '.join(str(exc).split())[:200]}") \
                from None
    if _lookup(loaded[file], key) is _MISSING:
        raise ValueError(f"{key}: required, {dvc_yaml} declares it as a param of {stage} in {file}; expected it "
                         f"in {target}")


def _item_value(item: Any, ref: str) -> str:
    if ref == "item":
        return str(item)
    if ref.startswith("item.") and isinstance(item, dict) and ref[5:] in item:
        return str(item[ref[5:]])
    return "${" + ref + "}"


def _read_dvc_yaml(path: Path) -> tuple[str, dict[str, Any]]:
    """The text of dvc.yaml and its ``stages`` mapping; an unreadable file is one ValueError naming it."""
    from pipeline.config import YAMLError, read_yaml

    try:
        text = path.read_text()
        return text, (read_yaml(text) or {}).get("stages") or {}
    except (OSError, YAMLError) as exc:
        raise ValueError(f"{path}: cannot read it to check it against params.yaml: "
                         f"{' '.join(str(exc).split())[:200]}") from None


def custom_stage(template: dict, name: str) -> dict:
    """The ``preprocess_<name>`` stage of a ``custom_<name>`` dataset: the shipped ``preprocess_custom`` stage
    (``template``) with the dataset renamed where it is named (the command's argument, the file dep, the params,
    the output), its code deps unchanged."""
    def renamed(entry: Any) -> Any:
        if entry == "${custom.source.path}":
            return f"${{{name}.source.path}}"
        if isinstance(entry, str) and entry.startswith("custom."):
            return name + entry[len("custom"):]
        if entry == "data/prepared/custom.parquet":
            return f"data/prepared/{name}.parquet"
        return entry

    stage = dict(template)
    stage["cmd"] = f"python stages/preprocess.py {name}"
    for field in ("deps", "params", "outs"):
        stage[field] = [renamed(e) for e in template.get(field) or []]
    return stage


def _custom_stage_text(root: Path, params, name: str) -> str:
    """``psrnn custom-stage``: the stage as YAML indented to go under ``stages:`` at the end of dvc.yaml."""
    from pipeline.config import dump_yaml, is_custom

    if name == "custom":
        raise ValueError("custom: has its stage in dvc.yaml already (preprocess_custom); expected a custom_<name> "
                         "section of your own")
    if not is_custom(name):
        raise ValueError(f"{name}: expected custom_<name> (lower-case letters, digits, underscores)")
    if name not in params.datasets:
        raise ValueError(f"{name}: no section in params.yaml; add it first (the keys of custom: source, two_stage, "
                         "kf, variants, model, train)")
    path = root / "dvc.yaml"
    text, stages = _read_dvc_yaml(path) if path.exists() else ("", {})
    if not isinstance(stages.get("preprocess_custom"), dict):
        raise ValueError(f"{path}: no preprocess_custom stage to copy; expected the dvc.yaml this project ships")
    if f"preprocess_{name}" in stages:
        raise ValueError(f"{path}: has a preprocess_{name} stage already")
    from pipeline.config import read_yaml

    keys = list(read_yaml(text) or {})
    if keys and keys[-1] != "stages":   # appended text would land in the last key's section, not under stages:
        raise ValueError(f"{path}: `stages:` is not its last top-level key ({', '.join(keys)}), so the stage cannot "
                         f"be appended; expected stages: last, or paste this command's output (without >>) under "
                         "stages: yourself")
    body = dump_yaml({f"preprocess_{name}": custom_stage(stages["preprocess_custom"], name)})
    lines = [f"  # {name}: your file {params.dataset(name).source['path']} (README, 'Adding your own dataset')"]
    lines += ["  " + line if line else line for line in body.splitlines()]
    # a blank line first; the stage goes under `stages:`, dvc.yaml's last top-level key, so appending is enough
    return ("\n" if text.endswith("\n") else "\n\n") + "\n".join(lines) + "\n"


def _project_files() -> set[str]:
    """The project's source files imported so far (modules of ``pipeline`` and the ``stages/`` script)."""
    base = Path(__file__).resolve().parent.parent
    files = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and (mod.__name__.split(".")[0] == "pipeline" or mod.__name__ == "__main__"):
            path = Path(f).resolve()
            if path.is_relative_to(base):  # the stages/<stage>.py script is __main__
                files.add(path.relative_to(base).as_posix())
    return files


def _trace_imports(stage: str, validation: set[str]) -> None:
    """With ``PSRNN_TRACE_IMPORTS=<file>``, append one JSON line: the project's source files the stage imported,
    and those that validating params.yaml had imported before it started (the schemas of every section).
    tests/test_pipeline_e2e.py checks them against the stage's deps in dvc.yaml."""
    import json

    out = os.environ.get("PSRNN_TRACE_IMPORTS")
    if not out:
        return
    record = {"stage": stage, "argv": sys.argv[1:], "files": sorted(_project_files()),
              "validation": sorted(validation)}
    with open(out, "a") as fh:
        fh.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    sys.exit(main())
