"""What the console scripts share: quiet logging and one-line errors."""
import logging
import sys


def add_data_args(group, split: str, purpose: str):
    """The data and batching options both tools read a split with."""
    group.add_argument("--data", metavar="DIR",
                       help="binarized data directory (default: the one recorded in the checkpoint)")
    group.add_argument("--split", default=split, help=f"data split to {purpose} (default: {split})")
    group.add_argument("--max-tokens", type=int, default=4096,
                       help="tokens per batch; use the training batch size (default: 4096)")
    group.add_argument("--batch-size", type=int, default=None,
                       help="sentences per batch (default: no limit)")
    group.add_argument("--max-batches", type=int, default=None,
                       help="use at most K random batches of the split (default: all of them)")
    group.add_argument("--seed", type=int, default=1, help="which random batches, in which order (default: 1)")
    group.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is available")


def configure_logging(verbose: bool):
    """Only warnings and errors unless -v: importing fairseq has configured the
    root logger at DEBUG (fairseq.models.wav2vec.wav2vec2_classification)."""
    logging.basicConfig(
        force=True,
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        stream=sys.stderr,
    )
    if not verbose:
        import warnings

        warnings.filterwarnings("ignore")


def fail(prog: str, message: str):
    """``prog: error: message`` on stderr and exit status 2, like argparse."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(2)
