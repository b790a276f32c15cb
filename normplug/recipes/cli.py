"""``normplug-recipe`` (``python -m normplug.recipes``): the driver's command line, where its errors
become one line and an exit status (2: a bad config or option, 1: a failed run, 130: ^C)."""
import argparse
import shlex
import sys

from normplug.errors import NormplugError
from normplug.tools.common import need_fairseq

from .commands import check_flags, train_argv
from .config import load_config
from .runs import check_data, evaluate, train
from .table import reproduce

PROG = "normplug-recipe"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="normplug-recipe", allow_abbrev=False, description=(
        "Run the recipes of configs/*.yaml: fairseq-train, the checkpoint they evaluate, its scores, "
        "the reproduction table. Arguments after -- go to fairseq-train (train, reproduce, argv) or "
        "fairseq-generate / fairseq-eval-lm (evaluate)."))
    sub = parser.add_subparsers(dest="cmd", required=True)

    def command(name, help, configs="config"):
        p = sub.add_parser(name, help=help, allow_abbrev=False)
        p.add_argument(configs, nargs="+" if configs == "configs" else None)
        if name != "table":
            p.add_argument("--data", help="binarized data folder (default: the config's)")
        if name in ("train", "reproduce", "argv"):
            p.add_argument("--gpus", type=int, default=1,
                           help="spread the run over N GPUs, update-freq divided by N (default 1)")
            p.add_argument("--bn-sync-stats", action="store_true",
                           help="with --gpus N: sync BN statistics across GPUs (default: per GPU)")
        return p

    command("train", "run fairseq-train from a config (fairseq-train arguments pass through)")
    p = command("evaluate", "pick/average checkpoints and score them: translation: decode, tokenized BLEU "
                            "and sacreBLEU; language model: perplexity (fairseq-eval-lm)")
    p.add_argument("--checkpoint-dir", help="save dir of the run (default checkpoints/<name>)")
    p.add_argument("--checkpoint", help="evaluate this checkpoint instead of the config's choice")
    p = command("reproduce", "train + evaluate configs into --out; results.md/.csv there", "configs")
    p.add_argument("--table-only", action="store_true", help="the same as the table command")
    for p in (p, command("table", "train and evaluate nothing: tabulate what the runs in --out left", "configs")):
        p.add_argument("--out", default="runs/reproduce", help="output folder (default %(default)s)")
    p = command("argv", "print the fairseq-train command line of a config")
    p.add_argument("--save-dir")
    command("check", "check configs: their format, their data folder, then fairseq-train's parser", "configs")
    return parser


def run(args, extra) -> int:
    if args.cmd != "table":
        need_fairseq(f"{PROG} {args.cmd}")
    if args.cmd == "train":
        return train(load_config(args.config), extra=extra, data=args.data, gpus=args.gpus,
                     bn_sync_stats=args.bn_sync_stats)
    if args.cmd == "evaluate":
        evaluate(load_config(args.config), args.checkpoint_dir, data=args.data, checkpoint=args.checkpoint,
                 extra_generate=extra)
    elif args.cmd in ("reproduce", "table"):
        return reproduce(args.configs, args.out, extra=extra, data=getattr(args, "data", None),
                         table_only=args.cmd == "table" or args.table_only, gpus=getattr(args, "gpus", 1),
                         bn_sync_stats=getattr(args, "bn_sync_stats", False))
    elif args.cmd == "argv":
        print(shlex.join(train_argv(load_config(args.config), args.save_dir, extra, args.data,
                                    gpus=args.gpus, bn_sync_stats=args.bn_sync_stats)))
    else:
        for path in args.configs:
            recipe = load_config(path)
            check_data(recipe, args.data)
            check_flags(recipe, train_argv(recipe, data=args.data, gpu=False)[1:])
            print(f"{path}: ok ({recipe.name}, {recipe.train.get('arch')})")
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
