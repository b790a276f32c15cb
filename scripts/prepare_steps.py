"""The machinery of scripts/prepare.py: the options every dataset takes, a step runner that resumes, one download
function, the checks of downloads and sizes, fairseq-preprocess and prepare.json. data/README.md describes them for
users.
"""
import argparse
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import prepare_corpus as corpus
import prepare_text as text
from prepare_text import PrepareError

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("train", "valid", "test")
# The value a config passes to fairseq-generate --remove-bpe for each BPE type.
REMOVE_BPE = {"subword-nmt": "@@ ", "none": None}
BPE = "subword-nmt"  # the default --bpe of a translation corpus
# Published size and checksum of an archive, by file name: enforced on every copy. The WMT ones: tensorflow/datasets
# tensorflow_datasets/url_checksums/wmt{14,16,17}_translate.txt; WikiText: huggingface/datasets
# datasets/wikitext/dataset_infos.json; PTB: PaddlePaddle python/paddle/dataset/imikolov.py (only an md5 is
# published).
PUBLISHED = {
    "training-parallel-europarl-v7.tgz":
        (657632379, "sha256:0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7"),
    "training-parallel-commoncrawl.tgz":
        (918311367, "sha256:c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5"),
    "training-parallel-nc-v11.tgz":
        (75178032, "sha256:cfe8ab047e05043476e498ee765c98e939c7b7d6d294e856344c84476b619d6a"),
    "training-parallel-nc-v12.tgz":
        (168591139, "sha256:2b45f30ef1d550d302fd17dd3a5cbe19134ccc4c2cf50c2dae534aee600101a2"),
    "wikitext-103-v1.zip": (190229076, "sha256:242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590"),
    "simple-examples.tgz": (None, "md5:30177ea32e27c525793142b6bf2c8e2d"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise PrepareError(f"{message} (see --help)")


def parse_options(name, argv, doc, bpe_size, flags):
    """The options of scripts/prepare-NAME.sh; ``bpe_size`` None: a word-level corpus (no --bpe options); ``flags``:
    the dataset's own switches, {--flag: help}."""
    ap = _Parser(prog=f"scripts/prepare-{name}.sh", description=doc, allow_abbrev=False,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--archive", default="", help="a local archive or folder instead of the download; a URL is downloaded")
    add("--url", default="", help="download from URL (a folder URL for several files) instead of the default")
    add("--sha256", default="", help="expected sha256 of the one archive")
    add("--sha256-file", default="", help="expected checksums (sha256sum format, by file name)")
    add("--work", default=str(REPO / "data" / name.split("-")[0]), help="working folder (default: %(default)s)")
    add("--dest", default="", help="fairseq-preprocess output (default: data/data-bin/<name>)")
    if bpe_size is not None:
        add("--bpe", default=BPE, help="subword-nmt or none (default: %(default)s)")
        add("--bpe-size", default=str(bpe_size), help="subword-nmt merges (default: %(default)s)")
    for flag, help in flags.items():
        add(flag, action="store_true", help=help)
    add("--skip-size-check", action="store_true", help="go on when the sizes differ from the published ones")
    add("--workers", default=str(os.cpu_count() or 1), help="processes for the text steps and fairseq-preprocess")
    add("--no-binarize", action="store_true", help="stop before fairseq-preprocess")
    add("--force", action="store_true", help="redo every step")
    o, unknown = ap.parse_known_args(argv)
    if unknown:
        valid = [s for a in ap._actions[1:] + ap._actions[:1] for s in a.option_strings if s.startswith("--")]
        raise PrepareError(f"unknown option '{unknown[0]}'; the options are: {' '.join(valid)}")
    o.bpe = getattr(o, "bpe", "none")
    if o.bpe not in REMOVE_BPE:
        raise PrepareError(f"--bpe must be subword-nmt or none, got '{o.bpe}'")
    if bpe_size is not None:
        if not o.bpe_size.isdigit():
            raise PrepareError(f"--bpe-size must be a whole number, got '{o.bpe_size}'")
        o.bpe_size = int(o.bpe_size)
        if o.bpe != "none" and o.bpe_size == 0:
            raise PrepareError(f"--bpe-size must be over 0 for --bpe {o.bpe} (use --bpe none for no BPE)")
    if not o.workers.isdigit() or int(o.workers) == 0:
        raise PrepareError(f"--workers must be a positive number, got '{o.workers}'")
    o.workers = int(o.workers)
    o.sha256 = o.sha256.lower()
    if o.sha256 and (len(o.sha256) != 64 or set(o.sha256) - set("0123456789abcdef")):
        raise PrepareError(f"--sha256 must be 64 hex digits, got '{o.sha256}'")
    if o.archive.startswith(("http://", "https://", "ftp://", "file://")):
        o.url, o.archive = o.archive, ""
    o.archive, o.dest = (Path(x).resolve() if x else None for x in (o.archive, o.dest))
    o.work = Path(o.work).resolve()
    if o.sha256_file and not Path(o.sha256_file).is_file():
        raise PrepareError(f"checksum list {o.sha256_file} (--sha256-file) not found")
    o.sums = {Path(f.strip().lstrip("*")).name: h.lower() for h, f in
              (x.split(None, 1) for x in (text.read_lines(o.sha256_file) if o.sha256_file else []) if x.strip())}
    o.command = " ".join([f"scripts/prepare-{name}.sh", *argv])
    return o


def digest(path, algo):
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(url, path):
    """URL -> PATH through PATH.part; a .part left by an earlier run is resumed with an HTTP Range request (a server
    that ignores it sends the whole file, which replaces the .part)."""
    part = path.with_name(path.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    hint = "without internet, fetch it elsewhere and pass --archive PATH"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(request, timeout=60) as r, \
                open(part, "ab" if have and r.status == 206 else "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    except urllib.error.HTTPError as e:
        if e.code != 416:  # 416: the .part is whole already
            raise PrepareError(f"cannot download {url} (HTTP {e.code} {e.reason}); {hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise PrepareError(f"cannot download {url} ({getattr(e, 'reason', e)}); {hint}") from None
    if not part.stat().st_size:
        part.unlink()
        raise PrepareError(f"the download of {url} came back empty; {hint}")
    part.replace(path)


class Prep:
    """One run of a dataset's recipe: its options ``o`` and the steps done so far."""

    def __init__(self, name, o, dest_name, lowercased):
        self.name, self.o, self.work = name, o, o.work
        self.lowercased = lowercased or getattr(o, "lowercase", False)
        self.dest = o.dest or REPO / "data" / "data-bin" / dest_name
        self.prev = None  # the last step's output
        self.size_check = "not run"
        self.t0 = time.time()
        if not o.no_binarize:
            near = Path(sys.executable).parent / "fairseq-preprocess"
            self.preprocess = str(near) if near.exists() else shutil.which("fairseq-preprocess")
            if not self.preprocess:
                raise PrepareError(f"fairseq-preprocess is neither next to {sys.executable} nor on PATH; "
                                   "run 'make setup', or pass --no-binarize")

    def log(self, message):
        print(f"[{self.name}] {message}", file=sys.stderr, flush=True)

    def step(self, name, func, *args, params="", out=None, **kwargs):
        """OUT (default WORK/NAME): done before if it exists, is newer than the previous step's output and was made
        with the same ``params`` (kept in OUT/.params); else func(OUT.tmp, *args, **kwargs) writes it, and OUT.tmp is
        renamed to OUT when func returns, so a killed run never leaves a step's output half written."""
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

    def tokenize(self, out, src, names, **moses):
        """tokenizer.perl (tokenize_file with the options ``moses``) on SRC/NAME -> OUT/NAME, NAME ending in .LANG."""
        for name in names:
            text.tokenize_file(src / name, out / name, name.rsplit(".", 1)[1], workers=self.o.workers, **moses)

    def fetch(self, files):
        """Step fetch: for each (NAME, URL, KIND of check_kind) a checked copy -> WORK/fetch/NAME (a link to the
        --archive file, to NAME in the --archive folder, or to the download in WORK/archives/), and the sha256 of each
        in WORK/fetch/sources.sha256."""
        if self.o.sha256 and len(files) > 1:
            raise PrepareError(f"--sha256 checks one archive; for the {len(files)} upstream files use "
                               "--sha256-file FILE")

        def run(out):
            sums = []
            for name, url, kind in files:
                a = self.o.archive
                path = (a / name if a.is_dir() else a) if a else self.work / "archives" / name
                if a and not path.is_file():
                    raise PrepareError(f"{path} not found (--archive: a file, or a folder holding {name})")
                if a:
                    url = None
                elif not path.exists():
                    self.log(f"downloading {url}")
                    download(url, path)
                sums.append(f"{self.verify(path, kind, url)}  {path.name}\n")
                os.symlink(path, out / name)
            (out / "sources.sha256").write_text("".join(sums))
        return self.step("fetch", run, params=f"archive={self.o.archive or ''} url={self.o.url}")

    def verify(self, path, kind, url):
        """The sha256 of PATH, once it is shown to be of KIND, whole, and of the expected size and checksum (--sha256,
        --sha256-file, or PUBLISHED). A bad download is set aside as .bad."""
        def bad(why):
            if url:
                path.replace(path.with_name(path.name + ".bad"))
                raise PrepareError(f"{path} {why}; it was downloaded from {url} and is now set aside as "
                                   f"{path}.bad; re-run to download it again, or pass --archive PATH to a good copy")
            raise PrepareError(f"{path} {why}; pass --archive PATH to a good copy")
        why = corpus.check_kind(path, kind, whole=True)
        if why:
            bad(why)
        size, want = PUBLISHED.get(path.name, (None, None))
        source = "the published checksum"
        if self.o.sha256 or path.name in self.o.sums:
            size, want, source = None, "sha256:" + (self.o.sha256 or self.o.sums[path.name]), "given"
        if size is not None and path.stat().st_size != size:
            bad(f"has {path.stat().st_size} bytes, the published {path.name} has {size} bytes "
                "(truncated, or another version)")
        sha = digest(path, "sha256")
        if want:
            algo, hexdigest = want.split(":")
            got = sha if algo == "sha256" else digest(path, algo)
            if got != hexdigest:
                bad(f"has {algo} {got}, expected {hexdigest} ({source}): checksum mismatch (corrupt, or another "
                    "version)")
            self.log(f"{algo} of {path.name} verified ({got}, {source})")
        return sha

    def extract(self, out, archive, sub=""):
        """Step extract's work: unpack the tar ARCHIVE into OUT[/SUB]."""
        try:
            with tarfile.open(archive) as t:
                t.extractall(out / sub, filter="data")
        except (tarfile.TarError, OSError, EOFError) as e:
            raise PrepareError(f"cannot extract {archive} ({e}); delete it and fetch it again, "
                               "or pass --archive PATH") from None

    def require(self, *paths):
        for p in paths:
            if not Path(p).is_file():
                raise PrepareError(f"{p} is missing: the archive is not the expected one "
                                   f"({self.o.archive or self.o.url or 'the download'}); pass --archive PATH "
                                   "to the right archive")

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
        if not bad:
            self.size_check = "passed"
            self.log(f"sizes match the published ones: {', '.join(good)}")
        elif self.o.skip_size_check:
            self.size_check = f"skipped: {'; '.join(bad)}"
            self.log(f"sizes differ from the published ones ({'; '.join(bad)}); going on (--skip-size-check)")
        else:
            raise PrepareError(f"sizes differ from the published ones: {'; '.join(bad)} (in {where}); the source or "
                               "a step is not the standard one; pass --skip-size-check to accept a deliberate change")

    def check_checksum(self, path, algo, want, source):
        """PATH, made by a step, is the published file (its ALGO digest, published by SOURCE)."""
        got = digest(path, algo)
        if got != want and not self.o.skip_size_check:
            raise PrepareError(f"{path} has {algo} {got}, the published one {want} ({source}): a source file is "
                               "another version; pass --skip-size-check to accept it")
        self.log(f"{path.name} has {algo} {got}, the published one {want}")

    def check_sizes(self, folder, lang, sizes):
        """FOLDER/SPLIT.LANG has the published number of lines, for each SPLIT: N of ``sizes``."""
        self.check_figures(folder, [(s, text.count_lines(folder / f"{s}.{lang}"), n, "pairs")
                                    for s, n in sizes.items()])

    def bpe_and_binarize(self, folder, src, tgt, info, preprocess_args=(), bpe_done=False):
        """Steps bpe-learn and bpe (a joint subword-nmt BPE learned on train.SRC then train.TGT; none with --bpe none
        or ``bpe_done``), then binarize (fairseq-preprocess --joined-dictionary) with prepare.json: ``info`` and what
        every corpus records."""
        if self.o.bpe != "none" and not bpe_done:
            codes = self.step("bpe-learn", lambda out: corpus.bpe_learn(
                out / "code", self.o.bpe_size, [folder / f"train.{src}", folder / f"train.{tgt}"]),
                params=f"{self.o.bpe} {self.o.bpe_size}") / "code"

            def apply(out):
                for s in SPLITS:
                    for lang in (src, tgt):
                        corpus.bpe_apply(codes, folder / f"{s}.{lang}", out / f"{s}.{lang}", self.o.workers)
                shutil.copy(codes, out / "code")
            folder = self.step("bpe", apply)
        info = {"source_lang": src, "target_lang": tgt, "bpe": self.o.bpe, "lowercased": self.lowercased,
                "bpe_size": self.o.bpe_size if self.o.bpe != "none" else None,
                "remove_bpe": REMOVE_BPE[self.o.bpe], **info}
        self.binarize(folder, ["--source-lang", src, "--target-lang", tgt, "--joined-dictionary", *preprocess_args],
                      lambda out: {**info, "sizes": {s: text.count_lines(folder / f"{s}.{src}") for s in SPLITS}})

    def binarize(self, folder, args, info):
        """Step binarize: fairseq-preprocess ARGS on FOLDER/{train,valid,test} -> the output folder, with FOLDER/code
        (the BPE codes) and prepare.json (``info(OUT)`` and the rest)."""
        if self.o.no_binarize:
            self.log(f"--no-binarize: the text for fairseq-preprocess is in {folder} (no prepare.json is written)")
            return

        def run(out):
            split_args = [a for s in SPLITS for a in (f"--{s}pref", str(folder / s))]
            if subprocess.run([self.preprocess, *args, *split_args, "--destdir", str(out),
                               "--workers", str(self.o.workers)]).returncode:
                raise PrepareError(f"fairseq-preprocess failed on {folder} (see its messages above)")
            if (folder / "code").exists():
                shutil.copy(folder / "code", out / "code")
            sources = dict(reversed(x.split(None, 1)) for x in text.read_lines(self.work / "fetch" / "sources.sha256"))
            manifest = {**info(out), "size_check": self.size_check, "sources": sources, "script": self.o.command,
                        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
            with open(out / "prepare.json", "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=2, ensure_ascii=False)
                f.write("\n")
        self.step("binarize", run, out=self.dest)
