"""One preparation run of a corpus (scripts/prepare.py): steps that a killed run resumes, the published sizes
checked, a joint subword-nmt BPE, and fairseq-preprocess with prepare.json (what was made).
"""
import datetime
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import moses
from textfiles import (PrepareError, check_aligned, chunks, count_lines, digest, iter_lines, parallel, read_lines,
                       write_lines)

SPLITS = ("train", "valid", "test")
REMOVE_BPE = {"subword-nmt": "@@ ", "none": None}  # what a config passes to fairseq-generate --remove-bpe
BPE = "subword-nmt"  # the default --bpe of a translation corpus


def preprocess_exe(alternative=""):
    """The fairseq-preprocess next to this Python (or on PATH), or one line saying why there is none."""
    try:
        from normplug.tools.common import fairseq_exe
        return fairseq_exe("fairseq-preprocess")
    except ImportError as e:
        raise PrepareError(f"cannot run fairseq-preprocess: {sys.executable} has no module {e.name}; install it, or "
                           f"name the Python that has it: PYTHON=/path/to/python{alternative}") from None
    except ValueError as e:
        raise PrepareError(f"cannot run fairseq-preprocess ({e}){alternative}") from None


def run_preprocess(exe, args, folder, out, workers):
    """fairseq-preprocess ARGS on FOLDER/{train,valid,test} into OUT."""
    split_args = [a for s in SPLITS for a in (f"--{s}pref", str(folder / s))]
    if subprocess.run([exe, *args, *split_args, "--destdir", str(out), "--workers", str(workers)]).returncode:
        raise PrepareError(f"fairseq-preprocess failed on {folder} (see its messages above)")


def data_digest(folder):
    """The identity of the binarized data in FOLDER: sha256 (16 hex digits) over the name and sha256 of every
    .bin, .idx and dict file fairseq-preprocess wrote, in sorted name order. The same text prepared again gives the
    same digest (no date in it), other text another."""
    files = sorted(p for p in folder.iterdir() if p.suffix in (".bin", ".idx") or p.name.startswith("dict."))
    listing = "".join(f"{p.name} {digest(p, 'sha256')}\n" for p in files)
    return hashlib.sha256(listing.encode("utf-8")).hexdigest()[:16]


def write_manifest(out, info, command):
    """OUT/prepare.json: INFO, the digest of the binarized data, the command that made the folder and the time."""
    manifest = {**info, "data_digest": data_digest(out), "script": command,
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    (out / "prepare.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", "utf-8")


class Preparation:
    """One run of a dataset's preparation: its options ``o`` and the steps done so far."""

    def __init__(self, name, o, dest, lowercased):
        self.name, self.o, self.work, self.dest = name, o, o.work, dest
        self.lowercased = lowercased or getattr(o, "lowercase", False)
        self.prev = None  # the last step's output
        self.skipped = []  # the published figures --skip-size-check let through
        self.t0 = time.time()
        if not o.no_binarize:  # before hours of text steps
            self.preprocess = preprocess_exe("; or pass --no-binarize")

    def log(self, message):
        print(f"[{self.name}] {message}", file=sys.stderr, flush=True)

    def step(self, name, func, *args, params="", out=None, **kwargs):
        """OUT (default WORK/NAME): done before if it exists, is newer than the previous step's output and was made
        with the same ``params`` (kept in OUT/.params); else func(OUT.tmp, *args, **kwargs) writes OUT.tmp, renamed
        to OUT when func returns, so a killed run never leaves a step's output half written."""
        out = Path(out or self.work / name)
        made = (out / ".params").read_text() if (out / ".params").exists() else ""
        fresh = out.is_dir() and (self.prev is None or out.stat().st_mtime_ns >= self.prev.stat().st_mtime_ns)
        if fresh and made == params and not self.o.force:
            self.log(f"step {name}: done before, skipping")
        else:
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            self.log(f"step {name}: running")
            t0 = time.time()
            func(tmp, *args, **kwargs)
            if params:
                (tmp / ".params").write_text(params)
            os.utime(tmp)  # newer than the step before, whatever mtimes an archive carried
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            self.log(f"step {name}: done ({time.time() - t0:.0f}s)")
        self.prev = out
        return out

    def tokenize(self, out, src, names, **options):
        """tokenizer.perl (moses.tokenize_file with ``options``) on SRC/NAME -> OUT/NAME, NAME ending in .LANG."""
        for name in names:
            moses.tokenize_file(src / name, out / name, name.rsplit(".", 1)[1], workers=self.o.workers, **options)

    def check_figures(self, where, figures):
        """Each (NAME, GOT, WANT, UNIT) of ``figures`` against the published WANT (a number or a (LO, HI) band): a
        difference stops the run, unless --skip-size-check."""
        good, bad = [], []
        for name, got, want, unit in figures:
            lo, hi = want if isinstance(want, tuple) else (want, want)
            if lo <= got <= hi:
                good.append(f"{name} {got} {unit}")
            else:
                bad.append(f"{name} has {got} {unit}, published {lo}" + (f"-{hi}" if hi != lo else ""))
        if bad and not self.o.skip_size_check:
            raise PrepareError(f"not as published: {'; '.join(bad)} (in {where}); the source or a step is not the "
                               "standard one; pass --skip-size-check to accept a deliberate change")
        self.skipped += bad
        self.log(f"not as published ({'; '.join(bad)}); going on (--skip-size-check)" if bad else
                 f"as published: {', '.join(good)}")

    def check_sizes(self, folder, src, tgt, sizes):
        """FOLDER/SPLIT.{SRC,TGT} are line-aligned, of the published N lines, for each SPLIT: N of ``sizes``."""
        for split in sizes:
            check_aligned(folder / f"{split}.{src}", folder / f"{split}.{tgt}")
        self.check_figures(folder, [(s, count_lines(folder / f"{s}.{src}"), n, "pairs") for s, n in sizes.items()])

    def bpe_and_binarize(self, folder, src, tgt, info, preprocess_args=()):
        """Steps bpe-learn and bpe (a joint subword-nmt BPE learned on train.SRC then train.TGT; none with --bpe
        none), then binarize (fairseq-preprocess --joined-dictionary) with prepare.json (``info`` and the rest)."""
        if self.o.bpe != "none":
            codes = self.step("bpe-learn", bpe_learn, self.o.bpe_size, [folder / f"train.{x}" for x in (src, tgt)],
                              params=f"{self.o.bpe} {self.o.bpe_size}") / "code"

            def apply(out):
                for name in (f"{s}.{lang}" for s in SPLITS for lang in (src, tgt)):
                    bpe_apply(codes, folder / name, out / name, self.o.workers)
                shutil.copy(codes, out / "code")
            folder = self.step("bpe", apply)
        info = {"source_lang": src, "target_lang": tgt, "bpe": self.o.bpe, "lowercased": self.lowercased,
                "bpe_size": self.o.bpe_size if self.o.bpe != "none" else None,
                "remove_bpe": REMOVE_BPE[self.o.bpe], **info}
        self.binarize(folder, ["--source-lang", src, "--target-lang", tgt, "--joined-dictionary", *preprocess_args],
                      lambda out: {**info, "sizes": {s: count_lines(folder / f"{s}.{src}") for s in SPLITS}})

    def binarize(self, folder, args, info):
        """Step binarize: fairseq-preprocess ARGS on FOLDER/{train,valid,test} -> the output folder, with FOLDER/code
        (the BPE codes) and prepare.json (``info(OUT)`` and the rest)."""
        if self.o.no_binarize:
            self.log(f"--no-binarize: the text for fairseq-preprocess is in {folder} (no prepare.json is written)")
            return

        def run(out):
            run_preprocess(self.preprocess, args, folder, out, self.o.workers)
            if (folder / "code").exists():
                shutil.copy(folder / "code", out / "code")
            sources = dict(reversed(x.split(None, 1)) for x in read_lines(self.work / "fetch" / "sources.sha256"))
            checked = f"skipped: {'; '.join(self.skipped)}" if self.skipped else "passed"
            write_manifest(out, {**info(out), "size_check": checked, "sources": sources}, self.o.command)
        self.step("binarize", run, out=self.dest)


def bpe_learn(out, merges, files):
    """subword-nmt learn-bpe -s MERGES < cat FILE... > OUT/code (min frequency 2), the files read line by line (no
    copy of WMT16's 2.6 GB)."""
    from subword_nmt.learn_bpe import learn_bpe

    with open(out / "code", "w", encoding="utf-8", newline="\n") as f:
        learn_bpe(itertools.chain.from_iterable(map(iter_lines, files)), f, merges, min_frequency=2)


_BPE = {}


def _bpe_chunk(args):
    codes, lines = args
    if codes not in _BPE:
        from subword_nmt.apply_bpe import BPE

        with open(codes, encoding="utf-8", newline="\n") as f:
            _BPE[codes] = BPE(f)
    # process_line keeps leading/trailing whitespace exactly as apply_bpe.py does with the line it reads (newline
    # included)
    return [_BPE[codes].process_line(line + "\n")[:-1] for line in lines]


def bpe_apply(codes, inp, out, workers=1, chunk=5000):
    """subword-nmt apply-bpe -c CODES < INP > OUT (separator '@@', no vocabulary filter)."""
    write_lines(out, parallel(_bpe_chunk, ((codes, c) for c in chunks(iter_lines(inp), chunk)), workers))
