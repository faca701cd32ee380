"""Command-line interface: `incofl prepare | partition | train | table | figures | paired | metrics |
compare | fedpart | analysis | bench | methods`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Iterable
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from incofl.config import (
    BUILT_IN,
    ConfigError,
    ExperimentConfig,
    RunConfig,
    load_experiment,
    load_run_config,
    parse_overrides,
)
from incofl.errors import EXIT_DIVERGED, Diverged
from incofl.numerics import NumericsError, decide, notice, pin

if TYPE_CHECKING:
    from incofl.data.dataset import ImageDataset
    from incofl.data.facts import Facts

# glibc's allocator costs 20-30% system time in CPU training; these must be set before
# Python starts, so the console script re-executes itself once with them (docs/performance.md).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296"}


# `incofl analysis` names: those of the Snakemake rules and of the results/analysis folders
ANALYSIS_NAMES = ("cka", "gradients", "theta_beta", "tsne", "groups", "robustness", "case_study")
# An --out with one of these suffixes is a file name, refused: every report command's --out is a folder
FILE_SUFFIXES = frozenset({".md", ".json", ".csv", ".tex", ".png", ".pdf", ".txt"})
# the run statistics a table or a comparison can show
STATISTICS = ("final_acc", "best_acc", "last10_acc")


class Parser(argparse.ArgumentParser):
    """argparse with the project's rule for bad input: one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_run_config(p: argparse.ArgumentParser) -> None:
    """--config and --set of the commands that set up or train one run (prepare, partition, train)."""
    data = ExperimentConfig.model_fields["datasets"].get_default(call_default_factory=True)[0]
    default = f"default: built-in defaults ({data}, {BUILT_IN['clients']} clients, ratio {BUILT_IN['ratio']})"
    p.add_argument("--config", "-c", help=f"experiment config (YAML); {default}")
    # action="extend": `--set a=1 --set b=2` = `--set a=1 b=2` (with the default "store", only the
    # last --set counted and the keys set before it silently kept the config's values)
    p.add_argument(
        "--set",
        "-s",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="override a run's settings, e.g. dataset=cifar10 alpha=1.0 method=InCoAvg seed=2; a dotted "
        "key sets one key of a mapping and keeps the others (method_args.mu=0.1, analyses.cka_rounds=[1]); "
        "values are YAML; applied after per_dataset, per_method and variants; may be repeated",
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
    cfg = load_run_config(args.config, parse_overrides(args.set))
    cfg.numerics, why = decide(cfg.numerics, cfg.device)  # auto: what this machine can hold, recorded by the run
    if why:
        print(notice(why), file=sys.stderr)
    pin(cfg.numerics)  # before the engine imports torch: its kernels are chosen once, at first use
    from incofl.fl.engine.simulator import train

    summary = train(cfg, args.out)
    print(
        f"{cfg.name} {cfg.dataset} alpha={cfg.alpha} seed={cfg.seed}: final {summary['final_acc']:.2f}% "
        f"best {summary['best_acc']:.2f}% last10 {summary['last10_acc']:.2f}% ({summary['wall_s']:.0f} s) -> {args.out}"
    )
    return 0


def cmd_federation_export(args: argparse.Namespace) -> int:
    from incofl.data.shares import declared_only
    from incofl.data.sources import dataset_for

    if args.declared and (args.client is not None or args.test):
        raise ConfigError("--declared writes no site's data file: drop --client and --test")
    cfg = load_run_config(args.config, parse_overrides(args.set))
    data = dataset_for(cfg)
    clients = range(cfg.clients) if args.client is None else [args.client]
    if args.client is None:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    keys = (Path(args.out) if args.client is None else Path(args.out).parent) / "keys"
    server = _make_server_key(keys)  # every site's file carries its public half: its node acts on nothing else
    if args.declared:  # no partition drawn: each site declares its own data's facts (docs/federation.md)
        facts, what = declared_only(data, cfg.clients, cfg.normalize), "each client's facts left to its site to declare"
        for client in clients if args.keys else []:
            print(f"client {client} of {cfg.clients}: node key {_node_key(keys, client)}")
    else:
        facts, what = _export_sites(args, cfg, data, clients, server), "every client's facts"
    print(f"{_server_facts(cfg, data, facts, keys)}: {what} and the test split, for the ServerApp")
    if args.keys:
        _site_certificates(keys.parent / "certificates", clients)
    return 0


def _export_sites(
    args: argparse.Namespace, cfg: RunConfig, data: ImageDataset, clients: Iterable[int], server: Path
) -> Facts:
    """Each of `clients`' data file (its share of the partition), said in one line each; the run's facts."""
    from incofl.data.partition import partition_for
    from incofl.data.shares import shares
    from incofl.deploy.site.sitedata import export_client
    from incofl.fl.stages.layout import tested_on_clients as tested_on_nodes

    partition = partition_for(cfg, data)
    tested = set(tested_on_nodes(cfg, cfg.pool_test))  # the clients this config's evaluation scores on the test split
    for client in clients:
        out = Path(args.out) / f"site{client}.npz" if args.client is None else Path(args.out)
        test = args.test or client in tested
        samples = export_client(cfg, data, partition, client, out, test=test, server_key=server.read_bytes())
        key = f"; node key {_node_key(out.parent / 'keys', client)}" if args.keys else ""
        print(
            f"{out}: client {client} of {cfg.clients} ({cfg.dataset} alpha={cfg.alpha}), {samples} samples"
            f"{', and the test split' if test else ''}{key}"
        )
    return shares(data, partition, cfg.holdout, cfg.partition_seed, cfg.normalize)[1]


def _site_certificates(folder: Path, clients: Iterable[int]) -> None:
    """The federation's CA and server certificate (for 127.0.0.1) in `folder`, made once, and each
    client's site certificate, without which the sites' port takes no connection."""
    from incofl.deploy.wire.credentials import certificates

    ca = certificates(folder, clients=clients)[0]
    print(f"certificates in {folder}: {ca.name} for every site, node<K>.pem and node<K>.key for client K's only")


def _make_server_key(folder: Path) -> Path:
    """The server's public key in `folder` (`server.pub`; its private half `server`, for the ServerApp), made once."""
    from incofl.deploy.wire.signing import server_key_pair

    private, public = server_key_pair(folder)
    print(
        f"server key {private} (the ServerApp's: node-keys/server, or server-key); {public} in each site file "
        "(a node on its site's own data: its server-key)"
    )
    return public


def _server_facts(cfg: RunConfig, data: ImageDataset, facts: Facts, keys: Path) -> Path:
    """The server's facts file in `keys` (deploy/server/serverdata.py), signed with the server's key there."""
    from incofl.data.facts import TestSplit
    from incofl.deploy.server.serverdata import FACTS, export_facts
    from incofl.deploy.wire.signing import SERVER, private_key

    out = keys / FACTS
    export_facts(cfg, TestSplit(data.x_test, data.y_test), facts, out, private_key(keys / SERVER))
    return out


def _node_key(folder: Path, client: int) -> Path:
    from incofl.deploy.wire.credentials import node_key  # cryptography comes with the flower extra

    return node_key(folder, client)[0]


def federation_numerics(requested: str) -> str:
    """The numerics `up` starts its processes with: `auto` decided once, here, for all of them
    (portable where it can hold, else native after one line saying why)."""
    numerics, why = decide(requested)
    if why:
        print(
            f"incofl federation up: numerics: auto starts every process native: portable numerics cannot hold "
            f"here ({why}); a run's numerics must be native then",
            file=sys.stderr,
        )
    return numerics


def cmd_federation_up(args: argparse.Namespace) -> int:
    from incofl.deploy.up import LocalFederation, site_data, up

    fed = LocalFederation(
        Path(args.sites),
        args.port,
        args.connection,
        Path(args.certificates) if args.certificates else None,
        args.insecure,
        Path(args.logs) if args.logs else None,
        federation_numerics(args.numerics),
        site_data(args.site_data),
        args.link_state,
    )
    try:
        return up(fed)
    except RuntimeError as err:  # a Flower process that failed to start
        print(f"incofl federation up: {err}", file=sys.stderr)
        return 1


def cmd_federation_edge_config(args: argparse.Namespace) -> int:
    from incofl.deploy.edge import Edge, render, site_bindings
    from incofl.deploy.flower.fleet import route_caps
    from incofl.deploy.wire.credentials import given_certificates

    tls = given_certificates(Path(args.certificates))
    bound = site_bindings(Path(args.keys))
    if not bound:
        raise ConfigError(f"--keys {args.keys}: no nodeK.pub (each site's registered node key, as client K's)")
    sites_at = dict(_site_address(value) for value in args.site_address)
    folder, fleet = Path(args.folder).resolve(), Path(args.fleet_socket).resolve()
    edge = Edge(args.listen, folder, fleet, tls, bound, route_caps(), sites_at, args.fd_limit)
    text = render(edge)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


def _site_address(value: str) -> tuple[str, int]:
    """`ADDRESS=SITES` (or `ADDRESS`: one site) as (address, sites); refused in one line otherwise."""
    import ipaddress

    address, _, count = value.partition("=")
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise ConfigError(f"--site-address {value}: not ADDRESS[=SITES] (an IP address)") from None
    if count and not (count.isdigit() and int(count) > 0):
        raise ConfigError(f"--site-address {value}: SITES must be a positive number")
    return address, int(count or 1)


def _in_grid(runs: Any, exp: Any, root: str | os.PathLike) -> Any:
    """Only the runs of the config's grid: a shared --runs root may hold other experiments' runs.
    A run's `method` is the name it is shown under (a variant's name). None of them: refused."""
    grid = runs[
        runs["dataset"].isin(exp.datasets)
        & runs["alpha"].isin(exp.alphas)
        & runs["method"].isin(exp.names)
        & runs["seed"].isin(exp.seeds)
    ]
    if grid.empty:
        raise ConfigError(
            f"--runs {root}: none of its {len(runs)} runs is in the config's grid (datasets, "
            "alphas, methods, seeds); is --config the one they were trained with?"
        )
    return grid


def _out_dir(args: argparse.Namespace, writes: str) -> Path:
    """--out, the output folder of every report command (`writes`: what goes in it)."""
    if Path(args.out).suffix.lower() in FILE_SUFFIXES:
        raise ConfigError(f"--out {args.out}: give the output folder (incofl {args.command} writes {writes} in it)")
    return Path(args.out)


def _summaries(exp: Any, roots: list[str]) -> Any:
    """The grid's runs of every root, one replicate each (several roots: the same seeds rerun)."""
    import pandas as pd

    from incofl.report.runs import collect_summaries

    frames = [_in_grid(collect_summaries(root), exp, root).assign(replicate=i) for i, root in enumerate(roots)]
    return pd.concat(frames, ignore_index=True)


def _bases(exp: Any) -> dict[str, str | None]:
    """Name shown -> the base method its table row and figure colour are paired with. A variant
    has its method's base (FedPart-W0: FedAvg, as FedPart), so that every setting of a method
    is compared with the same baseline; `incofl paired` compares a variant with its method."""
    from incofl.registry import base_of

    return {name: base_of(exp.method_of(m)) for m, name in zip(exp.methods, exp.names, strict=True)}


def _table2(exp: Any, summaries: Any, metric: str) -> Any:
    """Table 2 of the config's grid (its methods, data sets and alphas) from `summaries`."""
    from incofl.report.tables import table2

    return table2(
        summaries, metric=metric, methods=exp.names, base_of=_bases(exp), datasets=exp.datasets, alphas=exp.alphas
    )


def cmd_table(args: argparse.Namespace) -> int:
    from incofl.report.published import is_resnet_family, paper_table2
    from incofl.report.tables import write_metrics_json, write_tables

    out = _out_dir(args, "table2.md, table2.tex, table2.csv, metrics.json")
    exp = load_experiment(args.config)
    summaries = _summaries(exp, [args.runs]).drop(columns="replicate")
    metric = args.metric or exp.table_metric
    table = _table2(exp, summaries, metric)
    paper = paper_table2() if is_resnet_family(summaries) and not args.no_paper else None
    write_tables(table, out, metric=metric, paper=paper)
    write_metrics_json(table, args.metrics or out / "metrics.json")
    print((out / "table2.md").read_text())
    return 0


def cmd_figures(args: argparse.Namespace) -> int:
    from incofl.report.figures import plot_ablation, plot_curves
    from incofl.report.runs import collect_curves

    out = _out_dir(args, "curves_<dataset>_a<alpha> and ablation, PNG and PDF")
    exp = load_experiment(args.config)
    summaries = _summaries(exp, [args.runs]).drop(columns="replicate")
    bases = _bases(exp)
    paths = plot_curves(_in_grid(collect_curves(args.runs), exp, args.runs), out, methods=exp.names, base_of=bases)
    paths += plot_ablation(summaries, out, metric=exp.table_metric, methods=exp.names, base_of=bases)
    print("\n".join(str(p) for p in paths))
    return 0


def cmd_paired(args: argparse.Namespace) -> int:
    from incofl.atomic import write_text
    from incofl.report.paired import paired, statistics, to_markdown

    name = f"paired-{args.method}-vs-{args.base}.md"
    out = _out_dir(args, name) if args.out else None
    exp = load_experiment(args.config)
    for flag, method in (("--method", args.method), ("--base", args.base)):
        if method not in exp.names:
            raise ConfigError(f"{flag} {method}: not a method of the config's grid ({', '.join(exp.names)})")
    summaries = _summaries(exp, args.runs)
    text = to_markdown(paired(summaries, args.method, args.base, statistics(summaries)), args.method, args.base)
    if out:
        write_text(out / name, text)
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
    from incofl.report.runs import collect_curves
    from incofl.report.tables import metrics_json

    out = _out_dir(args, "metrics.json, curves.csv and, with --pair, paired.csv")
    exp, pairs = load_experiment(args.config), _pairs(args.pair)
    replicates = _summaries(exp, args.runs)
    tables = {
        Path(root).name: metrics_json(_table2(exp, replicates[replicates["replicate"] == i], exp.table_metric))
        for i, root in enumerate(args.runs)
    }
    curves = pd.concat(
        [seed_mean_curves(_in_grid(collect_curves(root), exp, root), Path(root).name) for root in args.runs]
    )
    paths = write_dvc_files(out, tables, curves, pair_tables(replicates, pairs))
    print("\n".join(str(p) for p in paths))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Exit code 0: every cell identical or reproduced; 1: some cell not reproduced; 3: none
    not, some inconclusive; 2: bad input (`run`: user_errors)."""
    from incofl.report import compare as c

    c.check_not_itself(args.rerun, args.committed)
    rerun, committed = c.read_runs(args.rerun), c.read_runs(args.committed)
    c.check_same_experiment(rerun, committed)
    table = c.compare(rerun, committed, args.metric, args.margin)
    print(c.to_markdown(table, args.metric, declared=args.margin is not None), end="")
    return c.exit_code(table)


def cmd_fedpart(args: argparse.Namespace) -> int:
    from incofl.atomic import write_text
    from incofl.report.fedpart import fedpart_report

    out = _out_dir(args, "fedpart.md")
    exp = load_experiment(args.config)
    _summaries(exp, [args.runs])  # refuses a root without the grid's runs, as every report does
    text = fedpart_report(args.runs, exp.names, {"dataset": exp.datasets, "alpha": exp.alphas, "seed": exp.seeds})
    write_text(out / "fedpart.md", text)
    print(text)
    return 0


def cmd_analysis(args: argparse.Namespace) -> int:
    from incofl.report import analyses

    out = _out_dir(args, "its figures and tables")
    if args.what in analyses.STUDIES:
        print("\n".join(str(p) for p in analyses.STUDIES[args.what](args.runs, out)))
        return 0
    options = {}
    if args.what == "theta_beta":
        named = dict(args.paper_name)
        options = {"layers": args.layers, "paper_names": {**analyses.PAPER_NAMES, **named}}
    analysis = analyses.ANALYSES[args.what]
    if not args.config:
        paths = analysis(args.runs, out, None, None, **options)
    else:  # one folder per (dataset, alpha) cell of the grid when it has several
        exp = load_experiment(args.config)
        cells = [(d, a) for d in exp.datasets for a in exp.alphas]
        paths = []
        for dataset, alpha in cells:
            grid = {"dataset": [dataset], "alpha": [alpha], "method": exp.names, "seed": exp.seeds}
            paths += analysis(
                args.runs, out / (f"{dataset}_a{float(alpha)}" if len(cells) > 1 else ""), exp.names, grid, **options
            )
    print("\n".join(str(p) for p in paths))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from incofl.bench import benchmark, format_per_client, format_report, per_client

    measure, show = (per_client, format_per_client) if args.per_client else (benchmark, format_report)
    result = measure(
        model=args.model,
        clients=args.clients,
        samples=args.samples,
        epochs=args.epochs,
        batch_size=args.batch_size,
        threads=args.threads,
        repeats=args.repeats,
        device=args.device,
    )
    print(json.dumps(result, indent=2) if args.json else show(result))
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from incofl.params import describe
    from incofl.registry import METHODS
    from incofl.spec import FULL

    for m in METHODS.values():
        planner = [] if m.planner is FULL else [m.planner.name]  # a partial plan is named
        stages = [*planner, m.objective.name, m.aggregator.name, *(t.name for t in m.pre + m.post)]
        trainers = "serial,batched" if m.objective.cls.client.batchable() else "serial"
        graphs = " cuda_graphs" if m.objective.cls.client.capturable() else ""
        print(f"{m.name:20s} base={m.base or '-':9s} stages={'+'.join(stages)} trainer={trainers}{graphs}")
        print(f"{'':20s} method_args: {describe(m.params)}")
    return 0


REPLICATES = (
    "roots of the run directories; several are replicates of the same seeds (e.g. CPU and GPU "
    "reruns): a seed's difference is taken within each root, then averaged"
)


def _add_report(sub: Any, name: str, helptext: str, out: str, replicates: bool = False, need_out: bool = True) -> Any:
    """A report command: its required --config, --runs (several: `replicates`) and --out, which
    is always an output folder (`out`: what is written there)."""
    p = sub.add_parser(name, help=helptext, description=helptext)
    # required: without it a report would show the built-in experiment's grid (none of the runs)
    p.add_argument(
        "--config",
        "-c",
        required=True,
        help="experiment config (YAML) the runs were trained with: "
        "its grid (datasets, alphas, methods, seeds) is what is reported",
    )
    runs = {"nargs": "+", "help": REPLICATES} if replicates else {"help": "root of the run directories"}
    p.add_argument("--runs", required=True, **runs)
    p.add_argument("--out", required=need_out, help=f"output folder, created if missing: {out}")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="incofl", description=__doc__)
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {version('incofl')}",
        help="print the package version and exit",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to do (incofl COMMAND --help: its flags)"
    )
    p = sub.add_parser("prepare", help="decode a data set once into the uint8 cache")
    _add_run_config(p)
    p.set_defaults(func=cmd_prepare)
    p = sub.add_parser("partition", help="write a client partition artifact (.npz with class histogram)")
    _add_run_config(p)
    p.add_argument("--out", required=True, help="the partition file to write (.npz)")
    p.set_defaults(func=cmd_partition)
    p = sub.add_parser("federation", help="real federations with Flower (docs/federation.md)")
    actions = p.add_subparsers(
        dest="action", required=True, metavar="ACTION", help="what to do (incofl federation ACTION --help: its flags)"
    )
    p = actions.add_parser("export", help="write each client's data file for its site's node (only its samples)")
    _add_run_config(p)
    p.add_argument(
        "--client", type=int, help="the client (0-based) whose samples are written; without it, every client's"
    )
    p.add_argument(
        "--out", required=True, help="the data file to write (.npz), the node's data-path; without --client, a folder"
    )
    p.add_argument(
        "--test",
        action="store_true",
        help="add the test split (added anyway to the files of clients whose models the config scores on it)",
    )
    p.add_argument(
        "--keys",
        action="store_true",
        help="also write each client's node key pair (keys/nodeK, keys/nodeK.pub beside the data files, made "
        "once): the private key goes to the site, the public key to the operator (flwr supernode register, "
        "the run's node-keys), and the TLS certificates (certificates/: the CA's ca.pem for every site, and "
        "client K's own nodeK.pem and nodeK.key, without which the sites' port takes no connection)",
    )
    p.add_argument(
        "--declared",
        action="store_true",
        help="for a federation whose sites all serve their own data (data-folder, data-npz): write no site's "
        "file and draw no partition, only the server's key and facts file (the data set's facts and test "
        "split), each client's facts left to its site's signed declaration; a run with a site that declares "
        "none is refused before any round",
    )
    p.set_defaults(func=cmd_federation_export)
    p = actions.add_parser(
        "up",
        help="a federation on this machine: nginx on the sites' port, a SuperLink behind it and one SuperNode per site "
        "file, until interrupted (SIGHUP: each site's certificate bound again to its node key in SITES/keys)",
    )
    p.add_argument("--sites", required=True, help="the folder of the site data files (incofl federation export)")
    p.add_argument(
        "--port",
        type=int,
        default=9092,
        help="the sites' port (the Fleet API only); the Control and Runtime APIs listen on the next one, on "
        "loopback, and the nodes on the ports after it",
    )
    p.add_argument("--connection", default="incofl-local", help="the connection added to Flower's config for flwr run")
    p.add_argument(
        "--certificates",
        help="TLS with one's own certificates: a folder with ca.pem, server.pem, server.key (for 127.0.0.1) "
        "and each site's client certificate, nodeK.pem and nodeK.key (issued from ca.key there where missing); "
        "default: SITES/certificates, made there unless present",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS and no node authentication (by default both, with a key pair per node in SITES/keys, "
        "registered): any node may claim any client and traffic is plain; a trusted loopback test only",
    )
    p.add_argument(
        "--site-data",
        action="append",
        default=[],
        metavar="CLIENT=PATH",
        help="start client CLIENT's node on its site's own data (docs/federation.md), in place of its file in "
        "SITES if any: PATH a folder of images by class (data-folder) or an .npz of x and y (data-npz); "
        "repeatable. Its node acts on the server's key in SITES/keys (incofl federation export; --declared "
        "where every site serves its own data)",
    )
    p.add_argument("--logs", help="the folder of each process's log (default: SITES/logs)")
    p.add_argument(
        "--link-state",
        choices=("memory", "disk"),
        default="memory",
        help="where the SuperLink keeps messages and their objects: in memory (a round costs it about half the "
        "CPU), or on disk in SQLite (SITES/superlink/state.db, made afresh), so that what nodes push is not held "
        "in memory (docs/federation.md)",
    )
    p.add_argument(
        "--numerics",
        choices=("native", "portable", "auto"),
        default="native",
        help="the CPU kernels of every process it starts (docs/workflow.md): a run's numerics must be these, "
        "or its server and nodes refuse it; auto: portable where they can hold here, else native, said in one line",
    )
    p.set_defaults(func=cmd_federation_up)
    p = actions.add_parser(
        "edge-config",
        help="the nginx configuration of a server's sites' port (what up starts), for an operator running nginx",
    )
    p.add_argument("--listen", default="0.0.0.0:9092", help="HOST:PORT the sites dial (nginx's stream listener)")
    p.add_argument("--folder", required=True, help="nginx's prefix, a private folder: its sockets, pid, spooled bodies")
    p.add_argument(
        "--fleet-socket",
        required=True,
        help="the unix socket of python -m incofl.deploy.superlink --fleet-socket (in a private folder)",
    )
    p.add_argument("--certificates", required=True, help="a folder with ca.pem, server.pem and server.key")
    p.add_argument(
        "--keys",
        required=True,
        help="a folder of each site's registered node key as nodeK.pub: site K's certificate (CN=nodeK) is bound to it",
    )
    p.add_argument(
        "--site-address",
        action="append",
        default=[],
        metavar="ADDRESS[=SITES]",
        help="an address sites are known to dial from, and how many (default 1): they get their connections apart "
        "from every other address's; repeatable",
    )
    p.add_argument("--fd-limit", type=int, default=65536, help="nginx's open-file limit (worker_rlimit_nofile)")
    p.add_argument("--out", help="write the configuration here (default: print it)")
    p.set_defaults(func=cmd_federation_edge_config)
    p = sub.add_parser("train", help="run (or resume) one federated training run")
    _add_run_config(p)
    p.add_argument("--out", required=True, help="run directory (metrics.csv, summary.json, train.log, ckpt.pt)")
    p.set_defaults(func=cmd_train)
    p = _add_report(
        sub,
        "table",
        "paper-style accuracy table (md, tex, csv, html) + metrics.json",
        "table2.md, table2.tex, table2.csv and metrics.json",
    )
    p.add_argument("--metric", choices=STATISTICS, help="the statistic shown (default: the config's table_metric)")
    p.add_argument("--metrics", help="where metrics.json goes instead, a file (default: OUT/metrics.json)")
    p.add_argument(
        "--no-paper",
        action="store_true",
        help="leave out the paper's Table 2 columns from table2.md (shown for ResNet runs)",
    )
    p.set_defaults(func=cmd_table)
    p = _add_report(
        sub,
        "figures",
        "accuracy curves and ablation bars (png, pdf)",
        "curves_<dataset>_a<alpha> and ablation, each .png and .pdf",
    )
    p.set_defaults(func=cmd_figures)
    p = _add_report(
        sub,
        "paired",
        "a method against a base, paired by seed: difference, standard error, sign test",
        "the table is also written there as paired-METHOD-vs-BASE.md (default: printed only)",
        replicates=True,
        need_out=False,
    )
    p.add_argument("--method", required=True, help="the method compared (a name of the config's methods)")
    p.add_argument("--base", required=True, help="the method it is compared with (a name of the config's methods)")
    p.set_defaults(func=cmd_paired)
    p = _add_report(
        sub,
        "metrics",
        "an experiment's metrics.json, curves.csv, paired.csv for dvc metrics/plots",
        "metrics.json, curves.csv and, with --pair, paired.csv",
        replicates=True,
    )
    p.add_argument(
        "--pair",
        action="append",
        default=[],
        metavar="METHOD=BASE",
        help="a paired comparison for paired.csv and metrics.json; may be repeated",
    )
    p.set_defaults(func=cmd_metrics)
    p = sub.add_parser(
        "compare",
        help="did a rerun reproduce committed runs? a verdict per cell and overall (exit 0: reproduced, "
        "1: not, 3: inconclusive)",
    )
    p.add_argument("rerun", help="root of the rerun's run directories (e.g. run/results/runs)")
    p.add_argument("committed", help="root of the committed run directories (e.g. results/runs)")
    p.add_argument("--metric", choices=STATISTICS, default="final_acc", help="the statistic compared (default: final)")
    p.add_argument(
        "--margin",
        "--tolerance",
        type=_points,
        metavar="POINTS",
        help="the equivalence margin in points: a cell is reproduced when the 95 percent interval of rerun - "
        "committed lies inside +-POINTS, whatever the number of seeds (default: one seed standard deviation of "
        "the committed runs, pooled over cells; --tolerance is its old name)",
    )
    p.set_defaults(func=cmd_compare)
    p = _add_report(
        sub, "fedpart", "FedPart's poster table: full vs partial updates per cycle, costs, warm-up", "fedpart.md"
    )
    p.set_defaults(func=cmd_fedpart)
    p = sub.add_parser("analysis", help="the paper's analyses from the runs' files (figures and tables)")
    p.add_argument(
        "what",
        type=_analysis_name,
        choices=ANALYSIS_NAMES,
        help="the analysis: the name of its Snakemake rule and results/analysis folder",
    )
    p.add_argument(
        "--config",
        "-c",
        help="experiment config (YAML): only its grid's runs, one subfolder of "
        "OUT per (dataset, alpha) cell when it has several (default: every run under --runs, of one "
        "cell)",
    )
    p.add_argument("--runs", required=True, help="root of the run directories (a study's: its folder)")
    p.add_argument("--out", required=True, help="output folder, created if missing: the analysis' figures and tables")
    p.add_argument("--layers", type=int, nargs="+", help="theta_beta: InCo targets, 1-based (default 11 13)")
    p.add_argument(
        "--paper-name",
        action="append",
        default=[],
        metavar="OURS=PAPER",
        type=_paper_name,
        help="theta_beta: the paper's row of a method (InCoAvg-noOpt='w/o optimisation')",
    )
    p.set_defaults(func=cmd_analysis)
    p = sub.add_parser("bench", help="engine vs plain PyTorch throughput, and aggregation share")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a report")
    p.add_argument(
        "--per-client",
        action="store_true",
        help="what a client costs beyond its samples: one round of --clients clients of --samples samples "
        "against one loop over the same samples (e.g. --model cnn20 --clients 1000 --samples 10 --batch-size 10 "
        "--epochs 1)",
    )
    p.add_argument("--model", default="resnet18", help="the model both paths train (default resnet18)")
    p.add_argument("--clients", type=int, default=4, help="clients trained per round (default 4)")
    p.add_argument(
        "--samples", type=int, default=500, help="samples per client (default 500: CIFAR-10 over 100 clients)"
    )
    p.add_argument("--epochs", type=int, default=2, help="local epochs per client (default 2)")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    p.add_argument(
        "--repeats", type=int, default=2, help="alternating repeats, the fastest of each path counts (default 2)"
    )
    p.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="cpu", help="where both paths run (default cpu)"
    )
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("methods", help="list the registered methods")
    p.set_defaults(func=cmd_methods)
    return parser


def _paper_name(text: str) -> tuple[str, str]:
    ours, sep, paper = text.partition("=")
    if not (sep and ours and paper):
        raise argparse.ArgumentTypeError(f"{text!r}: expected OURS=PAPER (a method's name = the paper's row)")
    return ours, paper


def _points(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: a number of points >= 0")
    return value


def _analysis_name(text: str) -> str:
    """The old hyphenated spellings (theta-beta, case-study) are refused with the name to use."""
    if text not in ANALYSIS_NAMES and text.replace("-", "_") in ANALYSIS_NAMES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is spelled {text.replace('-', '_')} (as its Snakemake rule and results/analysis folder)"
        )
    return text


def run(argv: list[str] | None = None) -> int:
    """Parse and dispatch. Bad input (config, data, files) is one line on stderr and exit code
    2; a diverged run one line and 3; Ctrl-C one line and 130. No traceback for any of them."""
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
    from incofl.fl.engine.checkpoint import CheckpointMismatch
    from incofl.fl.engine.rundir import RunDirError
    from incofl.fl.stages.clientstore import ClientStateError
    from incofl.report.runs import RunFileError

    return (
        ConfigError,
        NumericsError,
        FileNotFoundError,
        DataNotFoundError,
        PartitionError,
        ReleasePartitionError,
        CheckpointMismatch,
        ClientStateError,
        RunDirError,
        RunFileError,
    )


def main() -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `incofl methods | head` ends quietly
    if any(k not in os.environ for k in MALLOC_ENV):
        os.execve(sys.executable, [sys.executable, "-m", "incofl.cli", *sys.argv[1:]], {**os.environ, **MALLOC_ENV})
    sys.exit(run())


if __name__ == "__main__":
    main()
