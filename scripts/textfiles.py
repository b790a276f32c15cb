"""Text files one line at a time as perl, sed and awk read them (UTF-8, split on "\\n" only), and PrepareError: the
one-line error of a bad input or option that scripts/prepare.py prints as ERROR (OptionParser's too).
"""
import argparse
import hashlib
import itertools
import os
import shutil


class PrepareError(Exception):
    """A bad input or option, explained in one line."""


class OptionParser(argparse.ArgumentParser):
    """argparse whose errors are a PrepareError, an unknown option's with the list of the known ones."""

    def error(self, message):
        if message.startswith("unrecognized"):
            message += "; the options are: " + " ".join(s for a in self._actions for s in a.option_strings[-1:])
        raise PrepareError(f"{message} (see --help)")


def whole_number(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number over 0, got '{text}'")
    return int(text)


def digest(path, algo):
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def iter_lines(path):
    """Lines split on "\\n" only (streamed: the WMT16 training text is 4.5M lines a side)."""
    try:
        with open(path, encoding="utf-8", newline="\n") as f:
            for line in f:
                yield line[:-1] if line.endswith("\n") else line
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path} is not UTF-8 text ({e})") from None


def read_lines(path):
    return list(iter_lines(path))


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")


def chunks(lines, size):
    it = iter(lines)
    while batch := list(itertools.islice(it, size)):
        yield batch


def parallel(func, jobs, workers):
    """func over an iterable of jobs (each returning a list), results in order."""
    if workers <= 1:
        for job in jobs:
            yield from func(job)
        return
    import multiprocessing as mp

    with mp.get_context("fork").Pool(workers) as pool:
        for part in pool.imap(func, jobs):
            yield from part


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def check_aligned(*paths):
    counts = [count_lines(p) for p in paths]
    if len(set(counts)) != 1:
        raise PrepareError("files are not line-aligned: "
                           + ", ".join(f"{p} has {c} lines" for p, c in zip(paths, counts)))


def concat(paths, out, remove=False):
    """`cat PATHS > OUT` (and `rm PATHS`)."""
    with open(out, "wb") as f:
        for p in paths:
            with open(p, "rb") as part:
                shutil.copyfileobj(part, f, 1 << 20)
            if remove:
                os.remove(p)


def link(src, dst):
    """A hard link where the file system allows one (WMT's text is GBs), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy(src, dst)
