"""Command line of the pipeline: ``psrnn <stage> ...`` (the DVC stages call ``stages/<stage>.py``, which call
:func:`run`). Every failure ends in one line on stderr naming the file, key or value, and exit status 1."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Callable, Sequence

STAGES = ("download", "preprocess", "features", "two_stage", "decompose", "initialise", "refine", "evaluate",
          "report", "check")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="psrnn", description="PSRNN pipeline stages (normally run by `dvc repro`).")
    p.add_argument("--params", default=None, help="params file (default: <project root>/params.yaml)")
    p.add_argument("--root", default=None,
                   help="project root (default: $DVC_ROOT in the workspace, else the nearest folder of params.yaml, "
                        "e.g. the experiment's copy in a queued experiment)")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    sub = p.add_subparsers(dest="stage", required=True)
    sub.add_parser("check", help="validate params.yaml and exit")
    d = sub.add_parser("download", help="fetch and sha256-verify the raw files of a source (mirror when offline)")
    d.add_argument("source", help="ptb, swimmer, mocap or handwriting")
    d = sub.add_parser("preprocess", help="build data/prepared/<dataset>.parquet")
    d.add_argument("dataset", help="dataset section of params.yaml")
    for name, text in (("features", "draw the layer-1 RFF maps"), ("two_stage", "two-stage regression per depth"),
                       ("decompose", "CP decompositions for the factorized ranks"),
                       ("initialise", "initial weights of every model variant")):
        d = sub.add_parser(name, help=text)
        d.add_argument("dataset", help="dataset section of params.yaml")
        d.add_argument("seed", type=int, help="run seed (one of params.yaml seeds)")
    d = sub.add_parser("refine", help="BPTT training of one variant, for every seed (one MLflow run each)")
    d.add_argument("dataset", help="dataset section of params.yaml")
    d.add_argument("variant", help="a name from <dataset>.variants, e.g. factorized_psrnn_r60")
    d.add_argument("seed", nargs="?", type=int, default=None,
                   help="only this run seed (default: every seed in params.yaml)")
    d = sub.add_parser("evaluate", help="final metrics (and predictions) of every variant x seed of a dataset, "
                                        "or of one run when variant and seed are given")
    d.add_argument("dataset", help="dataset section of params.yaml")
    d.add_argument("variant", nargs="?", default=None, help="only this variant (needs seed too)")
    d.add_argument("seed", nargs="?", type=int, default=None, help="only this run seed")
    sub.add_parser("report", help="figures and results.md from every run's outputs")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from pipeline.config import ParamsError, load_params, project_root

    root = Path(args.root).resolve() if args.root else project_root()
    params_path = Path(args.params) if args.params else root / "params.yaml"
    try:
        params = load_params(params_path)
        seed = getattr(args, "seed", None)
        if seed is not None and seed not in params.seeds:
            raise ParamsError(f"seed {seed} is not in params.yaml seeds {params.seeds}")
        return _dispatch(args, params, root)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line, not a traceback, for every expected failure
        if args.verbose or not isinstance(exc, (ValueError, FileNotFoundError, RuntimeError, OSError, KeyError)):
            raise
        print(f"psrnn {args.stage}: error: {exc}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace, params, root: Path) -> int:
    from pipeline import workflow as wf

    stage = args.stage
    calls: dict[str, Callable[[], object]] = {
        "check": lambda: None,
        "download": lambda: wf.download(params, root, args.source),
        "preprocess": lambda: wf.prepare(params, root, args.dataset),
        "features": lambda: wf.features(params, root, args.dataset, args.seed),
        "two_stage": lambda: wf.two_stage(params, root, args.dataset, args.seed),
        "decompose": lambda: wf.decompose(params, root, args.dataset, args.seed),
        "initialise": lambda: wf.initialise(params, root, args.dataset, args.seed),
        "refine": lambda: wf.refine(params, root, args.dataset, args.variant, args.seed),
        "evaluate": lambda: (wf.evaluate_dataset(params, root, args.dataset) if args.variant is None
                             else wf.evaluate_run(params, root, args.dataset, args.variant, args.seed)),
        "report": lambda: wf.report(params, root),
    }
    if stage == "evaluate" and (args.variant is None) != (args.seed is None):
        raise ValueError("evaluate: give both variant and seed, or neither (every run of the dataset)")
    if stage in ("refine", "evaluate") and args.variant is not None:
        params.dataset(args.dataset).variant(args.variant)
    calls[stage]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
