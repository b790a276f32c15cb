"""``normplug-recipe`` (``python -m normplug.recipes``): the driver's command line, where its errors
become one line and an exit status (2: a bad config or option, 1: a failed run, 130: ^C)."""
import argparse
import sys

from normplug.errors import NormplugError
from normplug.launchers import launched_processes
from normplug.tools.common import need_fairseq, positive

from .commands import check_flags, check_visible_gpus, train_argv
from .compare import compare
from .config import ConfigError, load_config
from .passthrough import with_evaluation_arguments, with_training_arguments
from .records import RUN_RECORD, as_trained, check_data, read_json
from .launch import MASTER_PORT, Launch
from .runs import dry_run_note, evaluate, evaluate_commands, train, train_commands
from .table import reproduce, run_folder

PROG = "normplug-recipe"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False, description=(
        "Run the recipes of configs/*.yaml: fairseq-train, the checkpoint they evaluate, its scores, the table. "
        "Each run goes to OUT/<name> (OUT/<name>-seed<S> with --seeds). Arguments after -- go to fairseq-train "
        "(train, reproduce: the table marks the run modified) or, for evaluate, only --gen-subset, "
        "--source-lang, --target-lang and flags of speed; what else would change a score is refused."))
    sub = parser.add_subparsers(dest="cmd", required=True)

    def command(name, help, config="config"):
        p = sub.add_parser(name, help=help, allow_abbrev=False)
        p.add_argument(config, nargs="+" if config == "configs" else None)
        p.add_argument("--data", help="binarized data folder (default: the config's)")
        if name != "check":
            p.add_argument("--out", default="runs", help="folder of the runs, one subfolder a config and seed "
                                                         "(default %(default)s)")
            p.add_argument("--seeds", type=int, nargs="+", metavar="S", help="a run for each seed (fairseq's --seed), "
                           "in OUT/<name>-seed<S> (default: one run with the config's seed, in OUT/<name>)")
        if name in ("train", "evaluate", "reproduce"):
            p.add_argument("--dry-run", action="store_true", help="print the commands it would run (fairseq-train, "
                           "normplug-average, fairseq-generate or fairseq-eval-lm); run and write nothing")
        if name in ("train", "reproduce"):
            p.add_argument("--gpus", type=positive, default=1, help="spread each run over N GPUs (of each node), "
                           "update-freq divided by the processes (the effective batch kept); BN statistics per GPU "
                           "unless -- --bn-sync-stats (default 1)")
            p.add_argument("--nodes", type=positive, default=1, help="nodes of the run: run the same command on each, "
                           "with its --node-rank; torchrun on GPU nodes, one gloo process a node without (default 1)")
            p.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0 .. nodes-1 (default 0)")
            p.add_argument("--master-addr", metavar="HOST", help="node 0's address, reached by every node")
            p.add_argument("--master-port", type=positive, default=MASTER_PORT, help="a free port on node 0 (default "
                           "%(default)s; the next one too, for the driver's own rendezvous)")
        return p

    command("train", "run fairseq-train from a config (fairseq-train arguments pass through)")
    p = command("evaluate", "pick/average checkpoints and score them: translation: decode, tokenized BLEU "
                            "and sacreBLEU; language model: perplexity (fairseq-eval-lm); TID of BN/PN models")
    p.add_argument("--checkpoint", help="evaluate this checkpoint instead of the config's choice")
    command("reproduce", "train + evaluate configs into --out; results.md/.csv there", "configs")
    command("table", "train and evaluate nothing: tabulate what the runs in --out left", "configs")
    command("check", "check configs: their format, their data folder, then fairseq-train's parser", "configs")
    p = sub.add_parser("compare", allow_abbrev=False, help="each config in --out against a baseline: mean ± sd over "
                       "seeds, sacreBLEU's paired bootstrap and approximate randomization (translation), a paired "
                       "randomization test of window log-probabilities (language models); compare-<baseline>.md")
    p.add_argument("--out", default="runs", help="folder of the runs (default %(default)s)")
    p.add_argument("--baseline", required=True, metavar="NAME", help="the config every other is tested against")
    return parser


def each_seed(args, extra=()):
    """(the recipe of each run asked: config, --data, fairseq-train arguments and seed; its run folder)."""
    config = load_config(args.config, args.data)
    for seed in args.seeds or [None]:
        recipe = with_training_arguments(config, [*extra, *(["--seed", str(seed)] if args.seeds else [])])
        yield recipe, run_folder(args.out, recipe, bool(args.seeds))


def node_launch(args, dry: bool) -> Launch:
    """This node's part of the run asked; refused under a launcher that started several drivers."""
    launch = Launch(args.gpus, args.nodes, args.node_rank, args.master_addr, args.master_port)
    started = launched_processes()
    if started and not dry:
        raise ConfigError(f"{PROG} was started as one of {started[0]} processes by {started[2]}: each would train "
                          f"alone; run it once a node with --nodes N --node-rank R --master-addr HOST (it starts "
                          "torchrun itself), or run fairseq-train under your launcher (README: More than one machine)")
    if not dry:
        check_visible_gpus(args.gpus)
    return launch


def run(args, extra) -> int:
    dry = getattr(args, "dry_run", False)
    if args.cmd not in ("table", "compare") and not dry:
        need_fairseq(f"{PROG} {args.cmd}")
    launch = node_launch(args, dry) if args.cmd in ("train", "reproduce") else Launch()
    seeds = getattr(args, "seeds", None) or []
    if len(set(seeds)) < len(seeds) or any(seed < 0 for seed in seeds):
        raise ConfigError(f"--seeds {' '.join(map(str, seeds))}: give different whole numbers >= 0")
    if args.cmd == "compare":
        print(*compare(args.out, args.baseline), sep="\n")
        return 0
    if args.cmd in ("reproduce", "table"):
        return reproduce(args.configs, args.out, extra=extra, data=args.data, table_only=args.cmd == "table",
                         dry_run=dry, launch=launch, seeds=args.seeds)
    if args.cmd == "check":
        for path in args.configs:
            recipe = load_config(path, args.data)
            check_data(recipe)
            check_flags(recipe, train_argv(recipe, "checkpoints", gpu=False, exe=False))
            print(f"{path}: ok ({recipe.name}, {recipe.train.get('arch')})")
        return 0
    if dry:
        print(dry_run_note(launch if args.cmd == "train" else None))
    if args.cmd == "train":
        config = load_config(args.config, args.data)
        if launch.batch_note(config):
            print(launch.batch_note(config))
        for recipe, ckdir in each_seed(args, [*launch.batch_flags(config), *extra]):
            rc = print(*train_commands(recipe, ckdir, launch), sep="\n") if dry else train(recipe, ckdir, launch=launch)
            if rc:
                return rc
        return 0
    for recipe, ckdir in each_seed(args):
        if not args.checkpoint:  # the recipe its run was trained with: direction, seed, extra arguments
            recipe = as_trained(recipe, read_json(ckdir / RUN_RECORD))
        recipe = with_evaluation_arguments(recipe, extra)
        if dry:
            print(*evaluate_commands(recipe, ckdir, args.checkpoint), sep="\n")
        else:
            evaluate(recipe, ckdir, checkpoint=args.checkpoint)
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = build_parser()
    try:
        if own[:1] == ["train"]:  # everything fairseq-train understands passes through
            args, rest = parser.parse_known_args(own)
            extra = rest + extra
        else:
            args = parser.parse_args(own)
        return run(args, extra)
    except (NormplugError, RuntimeError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2 if isinstance(err, NormplugError) else 1
    except KeyboardInterrupt as err:
        print(f"{PROG}: interrupted" + (f": {err}" if str(err) else ""), file=sys.stderr)
        return 130
