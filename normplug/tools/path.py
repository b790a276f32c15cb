"""``normplug-path``: print the directory to pass to fairseq's ``--user-dir``."""
import argparse
import os

PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    argparse.ArgumentParser(
        prog="normplug-path", description="Print the directory of the installed normplug plugin, the value of "
        "fairseq's --user-dir.", epilog='example: fairseq-train DATA --user-dir "$(normplug-path)" '
        "--arch transformer_iwslt_de_en_rbn ...").parse_args(argv)
    print(PLUGIN_DIR)
