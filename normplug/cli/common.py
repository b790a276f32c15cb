"""What the console scripts share: quiet logging and one-line errors."""
import logging
import sys


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
