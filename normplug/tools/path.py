"""``normplug-path``: print the directory to pass to ``--user-dir``."""
import os


def main():
    print(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
