"""Command-line interface: `incofl prepare | partition | train | table | figures | paired | metrics |
fedpart | analysis | bench | methods`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from incofl.config import BUILT_IN, ConfigError, ExperimentConfig, load_experiment, load_run_config, parse_overrides

# glibc's allocator costs 20-30% system time in CPU training; these must be set before
# Python starts, so the console script re-executes itself once with them (DESIGN.md).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296"}


def _add_config(p: argparse.ArgumentParser, sets: bool = True) -> None:
    data = ExperimentConfig.model_fields["datasets"].get_default(call_default_factory=True)[0]
    default = f"default: built-in defaults ({data}, {BUILT_IN['clients']} clients, ratio {BUILT_IN['ratio']})"
    p.add_argument("--config", "-c", help=f"experiment config (YAML); {default}")
    if sets:
        # action="extend": `--set a=1 --set b=2` = `--set a=1 b=2` (with the default "store", only the
        # last --set counted and the keys set before it silently kept the config's values)
        p.add_argument(
            "--set",
            "-s",
            nargs="+",
            action="extend",
            default=[],
            metavar="KEY=VALUE",
            help="override config keys, e.g. dataset=cifar10 alpha=1.0 method=InCoAvg seed=2; may be repeated",
        )


def cmd_prepare(args: argparse.Namespace) -> int:
    from incofl.data.sources import load_dataset

    cfg = load_run_config(args.config, parse_overrides(args.set))
    data = load_dataset(cfg.dataset, cfg.data_dir, cfg.cache_dir)
    print(
        f"{cfg.dataset}: {len(data.y_train)} train / {len(data.y_test)} test images, "
        f"{data.channels}x{data.image_size}x{data.image_size}, {data.num_classes} classes, cached in {cfg.cache_dir}"
    )
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    from incofl.data.partition import partition_for
    from incofl.data.sources import dataset_for

    cfg = load_run_config(args.config, {**parse_overrides(args.set), "partition_file": None})
    part = partition_for(cfg, dataset_for(cfg))  # pool_test: over train + test, as the runs train
    part.save(args.out)
    sizes = part.histogram.sum(1)
    print(
        f"{args.out}: {cfg.partition} alpha={cfg.alpha} seed={cfg.partition_seed}, {cfg.clients} clients, "
        f"samples per client {sizes.min()}..{sizes.max()}, classes per client (>0) "
        f"{(part.histogram > 0).sum(1).min()}..{(part.histogram > 0).sum(1).max()}"
    )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from incofl.fl.simulation import train

    cfg = load_run_config(args.config, parse_overrides(args.set))
    summary = train(cfg, args.out)
    print(
        f"{cfg.name} {cfg.dataset} alpha={cfg.alpha} seed={cfg.seed}: final {summary['final_acc']:.2f}% "
        f"best {summary['best_acc']:.2f}% last10 {summary['last10_acc']:.2f}% ({summary['wall_s']:.0f} s) -> {args.out}"
    )
    return 0


def _in_grid(runs: Any, exp: Any) -> Any:
    """Only the runs of the config's grid: a shared --runs root may hold other experiments' runs.
    A run's `method` is the name it is shown under (a variant's name)."""
    return runs[
        runs["dataset"].isin(exp.datasets)
        & runs["alpha"].isin(exp.alphas)
        & runs["method"].isin(exp.names)
        & runs["seed"].isin(exp.seeds)
    ]


def _report_inputs(args: argparse.Namespace) -> tuple[Any, Any]:
    from incofl.report.runs import collect_summaries

    exp = load_experiment(args.config)
    return exp, _in_grid(collect_summaries(args.runs), exp)


def _bases(exp: Any) -> dict[str, str | None]:
    """Name shown -> the base method its table row and figure colour are paired with. A variant
    has its method's base (FedPart-W0: FedAvg, as FedPart), so that every setting of a method
    is compared with the same baseline; `incofl paired` compares a variant with its method."""
    from incofl.fl.methods import base_of

    return {name: base_of(exp.method_of(m)) for m, name in zip(exp.methods, exp.names, strict=True)}


def _table2(exp: Any, summaries: Any, metric: str) -> Any:
    """Table 2 of the config's grid (its methods, data sets and alphas) from `summaries`."""
    from incofl.report.tables import table2

    return table2(summaries, metric=metric, methods=exp.names, base_of=_bases(exp), datasets=exp.datasets,
                  alphas=exp.alphas)  # fmt: skip


def cmd_table(args: argparse.Namespace) -> int:
    from incofl.report.published import is_resnet_family, paper_table2
    from incofl.report.tables import write_metrics_json, write_tables

    exp, summaries = _report_inputs(args)
    metric = args.metric or exp.table_metric
    table = _table2(exp, summaries, metric)
    paper = paper_table2() if is_resnet_family(summaries) and not args.no_paper else None
    write_tables(table, args.out, metric=metric, paper=paper)
    write_metrics_json(table, args.metrics or Path(args.out) / "metrics.json")
    print((Path(args.out) / "table2.md").read_text())
    return 0


def cmd_figures(args: argparse.Namespace) -> int:
    from incofl.report.figures import plot_ablation, plot_curves
    from incofl.report.runs import collect_curves

    exp, summaries = _report_inputs(args)
    bases = _bases(exp)
    paths = plot_curves(_in_grid(collect_curves(args.runs), exp), args.out, methods=exp.names, base_of=bases)
    paths += plot_ablation(summaries, args.out, metric=exp.table_metric, methods=exp.names, base_of=bases)
    print("\n".join(str(p) for p in paths))
    return 0


def cmd_paired(args: argparse.Namespace) -> int:
    import pandas as pd

    from incofl.atomic import atomic_path
    from incofl.report.paired import paired, statistics, to_markdown
    from incofl.report.runs import collect_summaries

    exp = load_experiment(args.config)
    summaries = pd.concat(
        [_in_grid(collect_summaries(root), exp).assign(replicate=i) for i, root in enumerate(args.runs)],
        ignore_index=True,
    )
    text = to_markdown(paired(summaries, args.method, args.base, statistics(summaries)), args.method, args.base)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(args.out) as tmp:
            Path(tmp).write_text(text)
    print(text)
    return 0


def _pairs(texts: list[str]) -> list[tuple[str, str]]:
    pairs = [tuple(t.split("=", 1)) for t in texts]
    bad = [t for t, p in zip(texts, pairs, strict=True) if len(p) != 2 or not all(p)]
    if bad:
        raise ConfigError(f"--pair {bad[0]!r}: expected METHOD=BASE")
    return pairs  # type: ignore[return-value]


def cmd_metrics(args: argparse.Namespace) -> int:
    import pandas as pd

    from incofl.report.dvc import pair_tables, seed_mean_curves, write_dvc_files
    from incofl.report.runs import collect_curves, collect_summaries
    from incofl.report.tables import metrics_json

    exp, pairs = load_experiment(args.config), _pairs(args.pair)
    summaries = {Path(root).name: _in_grid(collect_summaries(root), exp) for root in args.runs}
    tables = {name: metrics_json(_table2(exp, runs, exp.table_metric)) for name, runs in summaries.items()}
    curves = pd.concat([seed_mean_curves(_in_grid(collect_curves(root), exp), Path(root).name) for root in args.runs])
    replicates = pd.concat([runs.assign(replicate=i) for i, runs in enumerate(summaries.values())], ignore_index=True)
    paths = write_dvc_files(args.out, tables, curves, pair_tables(replicates, pairs))
    print("\n".join(str(p) for p in paths))
    return 0


def cmd_fedpart(args: argparse.Namespace) -> int:
    from incofl.atomic import atomic_path
    from incofl.report.fedpart import fedpart_report

    exp = load_experiment(args.config)
    text = fedpart_report(args.runs, exp.names, {"dataset": exp.datasets, "alpha": exp.alphas, "seed": exp.seeds})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(args.out) as tmp:
        Path(tmp).write_text(text)
    print(text)
    return 0


def cmd_analysis(args: argparse.Namespace) -> int:
    from incofl.report import analyses

    if args.what in analyses.STUDIES:
        print("\n".join(str(p) for p in analyses.STUDIES[args.what](args.runs, args.out)))
        return 0
    options = {}
    if args.what == "theta-beta":
        named = dict(pair.split("=", 1) for pair in args.paper_name)
        options = {"layers": args.layers, "paper_names": {**analyses.PAPER_NAMES, **named}}
    analysis = analyses.ANALYSES[args.what]
    if not args.config:
        paths = analysis(args.runs, args.out, None, None, **options)
    else:  # one folder per (dataset, alpha) cell of the grid when it has several
        exp = load_experiment(args.config)
        cells = [(d, a) for d in exp.datasets for a in exp.alphas]
        paths = []
        for dataset, alpha in cells:
            grid = {"dataset": [dataset], "alpha": [alpha], "method": exp.names, "seed": exp.seeds}
            out = Path(args.out) / (f"{dataset}_a{float(alpha)}" if len(cells) > 1 else "")
            paths += analysis(args.runs, out, exp.names, grid, **options)
    print("\n".join(str(p) for p in paths))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from incofl.bench import benchmark, format_report

    result = benchmark(
        model=args.model,
        clients=args.clients,
        samples=args.samples,
        epochs=args.epochs,
        batch_size=args.batch_size,
        threads=args.threads,
        repeats=args.repeats,
        device=args.device,
    )
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from incofl.fl.methods import METHODS
    from incofl.fl.params import describe
    from incofl.fl.plan import FullPlanner

    for m in METHODS.values():
        planner = [] if m.planner is FullPlanner else [m.planner.__name__]  # a partial plan is named
        stages = [*planner, m.objective.__name__, m.aggregator.__name__, *(t.__name__ for t in m.pre + m.post)]
        trainers = "serial,batched" if m.objective.batchable() else "serial"
        print(f"{m.name:20s} base={m.base or '-':9s} stages={'+'.join(stages)} trainer={trainers}")
        print(f"{'':20s} method_args: {describe(m.params)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="incofl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="decode a data set once into the uint8 cache")
    _add_config(p)
    p.set_defaults(func=cmd_prepare)
    p = sub.add_parser("partition", help="write a client partition artifact (.npz with class histogram)")
    _add_config(p)
    p.add_argument("--out", required=True, help="output .npz")
    p.set_defaults(func=cmd_partition)
    p = sub.add_parser("train", help="run (or resume) one federated training run")
    _add_config(p)
    p.add_argument("--out", required=True, help="run directory (metrics.csv, summary.json, train.log, ckpt.pt)")
    p.set_defaults(func=cmd_train)
    for name, func, helptext in (
        ("table", cmd_table, "paper-style accuracy table (md, tex, csv) + metrics.json"),
        ("figures", cmd_figures, "accuracy curves and ablation bars (png, pdf)"),
    ):
        p = sub.add_parser(name, help=helptext)
        _add_config(p, sets=False)
        p.add_argument("--runs", required=True, help="root of the run directories")
        p.add_argument("--out", required=True, help="output directory")
        if name == "table":
            p.add_argument("--metric", choices=["final_acc", "best_acc", "last10_acc"])
            p.add_argument("--metrics", help="metrics.json path (default: OUT/metrics.json)")
            p.add_argument(
                "--no-paper",
                action="store_true",
                help="leave out the paper's Table 2 columns from table2.md (shown for ResNet runs)",
            )
        p.set_defaults(func=func)
    p = sub.add_parser("paired", help="a method against a base, paired by seed: difference, standard error, sign test")
    _add_config(p, sets=False)
    p.add_argument("--runs", required=True, nargs="+", help="roots of the run directories; several are "
                   "replicates of the same seeds (e.g. CPU and GPU reruns): a seed's difference is "
                   "taken within each root, then averaged")  # fmt: skip
    p.add_argument("--method", required=True)
    p.add_argument("--base", required=True)
    p.add_argument("--out", help="also write the Markdown table here")
    p.set_defaults(func=cmd_paired)
    p = sub.add_parser("metrics", help="an experiment's metrics.json, curves.csv, paired.csv for dvc metrics/plots")
    _add_config(p, sets=False)
    p.add_argument("--runs", required=True, nargs="+", help="roots of the run directories (replicates, as paired)")
    p.add_argument("--pair", action="append", default=[], metavar="METHOD=BASE", help="a paired comparison")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=cmd_metrics)
    p = sub.add_parser("fedpart", help="FedPart's poster table: full vs partial updates per cycle, costs, warm-up")
    _add_config(p, sets=False)
    p.add_argument("--runs", required=True, help="root of the run directories")
    p.add_argument("--out", required=True, help="the Markdown file to write")
    p.set_defaults(func=cmd_fedpart)
    p = sub.add_parser("analysis", help="the paper's analyses from the runs' files (figures and tables)")
    p.add_argument("what", choices=["cka", "gradients", "theta-beta", "tsne", "groups", "robustness", "case-study"])
    _add_config(p, sets=False)
    p.add_argument("--runs", required=True, help="root of the run directories (a study's: its folder)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--layers", type=int, nargs="+", help="theta-beta: InCo targets, 1-based (default 11 13)")
    p.add_argument("--paper-name", action="append", default=[], metavar="OURS=PAPER",
                   help="theta-beta: the paper's row of a method (InCoAvg-noOpt='w/o optimisation')")  # fmt: skip
    p.set_defaults(func=cmd_analysis)
    p = sub.add_parser("bench", help="engine vs plain PyTorch throughput, and aggregation share")
    p.add_argument("--json", action="store_true")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--samples", type=int, default=500, help="samples per client (CIFAR-10 / 100 clients)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int)
    p.add_argument("--repeats", type=int, default=2, help="alternating repeats; the fastest of each path counts")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu", help="where both paths run")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("methods", help="list the registered methods")
    p.set_defaults(func=cmd_methods)
    return parser


def run(argv: list[str] | None = None) -> int:
    """Parse and dispatch. Bad input (config, data, files) is one line on stderr and exit code
    2; a diverged run one line and 3; Ctrl-C one line and 130. No traceback for any of them."""
    from incofl.fl.divergence import EXIT_DIVERGED, Diverged

    args = build_parser().parse_args(argv)
    say = f"incofl {args.command}"
    try:
        return args.func(args)
    except Diverged as err:
        print(f"{say}: {err} (summary.json records status: diverged)", file=sys.stderr)
        return EXIT_DIVERGED
    except KeyboardInterrupt:
        print(f"{say}: interrupted; the last checkpoint is kept: rerun the same command to resume", file=sys.stderr)
        return 130
    except user_errors() as err:
        print(f"{say}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk, a read-only or missing directory, an --out that is a file
        where = f"{err.filename}: " if err.filename else ""
        print(f"{say}: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2


def user_errors() -> tuple[type[Exception], ...]:
    """The exceptions that mean bad input, each phrased as one line naming the key or file."""
    from incofl.data.partition import PartitionError
    from incofl.data.release import ReleasePartitionError
    from incofl.data.sources import DataNotFoundError
    from incofl.fl.checkpoint import CheckpointMismatch
    from incofl.fl.rundir import RunDirError

    return (ConfigError, FileNotFoundError, DataNotFoundError, PartitionError, ReleasePartitionError,
            CheckpointMismatch, RunDirError)  # fmt: skip


def main() -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `incofl methods | head` ends quietly
    if any(k not in os.environ for k in MALLOC_ENV):
        os.execve(sys.executable, [sys.executable, "-m", "incofl.cli", *sys.argv[1:]], {**os.environ, **MALLOC_ENV})
    sys.exit(run())


if __name__ == "__main__":
    main()
