"""``normplug-path``: print the directory to pass to ``--user-dir``."""
import os


def main():
    import normplug

    print(os.path.dirname(os.path.abspath(normplug.__file__)))


if __name__ == "__main__":
    main()
