"""``normplug-recipe`` (``python -m normplug.recipes``): the driver's command line, where its errors
become one line and an exit status (2: a bad config or option, 1: a failed run, 130: ^C)."""
import argparse
import sys

from normplug.errors import NormplugError
from normplug.tools.common import need_fairseq, positive

from .commands import check_flags, check_visible_gpus, gpu_flags, train_argv
from .config import load_config
from .runs import check_data, dry_run_note, evaluate, evaluate_commands, reproduce, train, train_command

PROG = "normplug-recipe"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False, description=(
        "Run the recipes of configs/*.yaml: fairseq-train, the checkpoint they evaluate, its scores, the table. "
        "Arguments after -- go to fairseq-train (train, reproduce) or fairseq-generate / -eval-lm (evaluate)."))
    sub = parser.add_subparsers(dest="cmd", required=True)

    def command(name, help, config="config"):
        p = sub.add_parser(name, help=help, allow_abbrev=False)
        p.add_argument(config, nargs="+" if config == "configs" else None)
        if name != "table":
            p.add_argument("--data", help="binarized data folder (default: the config's)")
        if name in ("train", "evaluate", "reproduce"):
            p.add_argument("--dry-run", action="store_true", help="print the commands it would run (fairseq-train, "
                           "normplug-average, fairseq-generate or fairseq-eval-lm); run and write nothing")
        if name in ("train", "reproduce"):
            p.add_argument("--gpus", type=positive, default=1, help="spread each run over N GPUs, update-freq divided "
                           "by N (the effective batch kept); BN statistics per GPU unless -- --bn-sync-stats (default 1)")
        if name in ("reproduce", "table"):
            p.add_argument("--out", default="runs/reproduce", help="output folder (default %(default)s)")
        return p

    command("train", "run fairseq-train from a config (fairseq-train arguments pass through)")
    p = command("evaluate", "pick/average checkpoints and score them: translation: decode, tokenized BLEU "
                            "and sacreBLEU; language model: perplexity (fairseq-eval-lm)")
    p.add_argument("--checkpoint-dir", help="save dir of the run (default checkpoints/<name>)")
    p.add_argument("--checkpoint", help="evaluate this checkpoint instead of the config's choice")
    command("reproduce", "train + evaluate configs into --out; results.md/.csv there", "configs")
    command("table", "train and evaluate nothing: tabulate what the runs in --out left", "configs")
    command("check", "check configs: their format, their data folder, then fairseq-train's parser", "configs")
    return parser


def run(args, extra) -> int:
    dry = getattr(args, "dry_run", False)
    if args.cmd != "table" and not dry:
        need_fairseq(f"{PROG} {args.cmd}")
    if args.cmd in ("train", "reproduce") and not dry:
        check_visible_gpus(args.gpus)
    if args.cmd in ("reproduce", "table"):
        return reproduce(args.configs, args.out, extra=extra, data=getattr(args, "data", None),
                         table_only=args.cmd == "table", dry_run=dry, gpus=getattr(args, "gpus", 1))
    if args.cmd == "check":
        for path in args.configs:
            recipe = load_config(path, args.data)
            check_data(recipe, args.data)
            check_flags(recipe, train_argv(recipe, data=args.data, gpu=False, exe=False))
            print(f"{path}: ok ({recipe.name}, {recipe.train.get('arch')})")
        return 0
    recipe = load_config(args.config, args.data)
    if args.cmd == "train":
        extra = gpu_flags(recipe, args.gpus) + extra
    if args.cmd == "train" and dry:
        print(dry_run_note(args.gpus), train_command(recipe, None, extra, args.data), sep="\n")
    elif args.cmd == "train":
        return train(recipe, extra=extra, data=args.data)
    elif dry:
        print(dry_run_note(), *evaluate_commands(recipe, args.checkpoint_dir, args.data, args.checkpoint, extra),
              sep="\n")
    else:
        evaluate(recipe, args.checkpoint_dir, data=args.data, checkpoint=args.checkpoint, extra_generate=extra)
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
