"""Text steps shared by scripts/prepare-*.sh (run as a file: it imports nothing
from normplug, so the scripts do not pay for importing torch or fairseq).

    python scripts/prepare_text.py <command> [args]

Commands (each reads whole files and writes whole files; the calling script
writes into a temporary folder and renames it on success):

  sha256 FILE                          print the file's sha256
  iwslt-train IN OUT [--classic]       IWSLT train.tags.* -> one sentence a line
  iwslt-xml OUT XML [XML ...]          IWSLT *.xml -> the text of each <seg id="N">,
                                       the files concatenated in the order given
  tokenize --lang L IN OUT [IN OUT..]  Moses tokenizer (sacremoses), escaping as
                                       tokenizer.perl does by default
  filter-pairs SRC TGT OUT_SRC OUT_TGT keep pairs with MIN <= tokens <= MAX on both
        [--min 1] [--max 175] [--ratio 1.5]   sides and length ratio <= RATIO
  lowercase IN OUT [IN OUT ...]
  split-every N IN KEEP_OUT EVERY_OUT  lines N, 2N, ... -> EVERY_OUT, others -> KEEP_OUT
  check-aligned FILE FILE...           fail unless all files have the same line count
  spm-train PREFIX VOCAB FILE...       joint sentencepiece BPE model PREFIX.model
  spm-encode MODEL IN OUT [IN OUT..]   apply it (pieces separated by spaces)

Every command exits non-zero with a one-line message on bad input.
"""
import argparse
import hashlib
import os
import re
import sys

WORKERS = max(1, int(os.environ.get("NORMPLUG_PREPARE_WORKERS", os.cpu_count() or 1)))


class PrepareError(Exception):
    pass


def read_lines(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]


# Characters that some readers take as line breaks (Python's universal newlines
# split on a lone \r): replaced by spaces so both sides stay line-aligned.
_BREAKS = str.maketrans({c: " " for c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line.translate(_BREAKS) + "\n")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- IWSLT text extraction ---------------------------------------------------

# A metadata line of train.tags.*: it starts with an opening or closing tag,
# e.g. <url>, <keywords>, <speaker>, <talkid>, <reviewer href=...>, <translator ...>,
# <doc docid=...>, </doc>. <title> and <description> lines keep their text.
_TAG_LINE = re.compile(r"^\s*<\s*/?\s*([A-Za-z][A-Za-z0-9_-]*)\b[^>]*>")
_KEEP_TAGS = ("title", "description")
_STRIP_TAGS = re.compile(r"<\s*/?\s*(?:title|description)\s*>")
_CLASSIC_DROP = ("<url>", "<talkid>", "<keywords>")


def iwslt_train_lines(lines, classic=False):
    """Sentences of an IWSLT ``train.tags.*`` file.

    Default: drop every line that starts with a tag other than <title> and
    <description> (url, talkid, keywords, speaker, reviewer, translator, doc,
    ...), and strip the <title>/<description> tags, keeping their text.
    ``classic``: exactly fairseq's old prepare-iwslt14.sh, which drops only
    lines containing <url>, <talkid> or <keywords>.
    """
    out = []
    for line in lines:
        if classic:
            if any(t in line for t in _CLASSIC_DROP):
                continue
        else:
            m = _TAG_LINE.match(line)
            if m and m.group(1).lower() not in _KEEP_TAGS:
                continue
        out.append(_STRIP_TAGS.sub("", line))
    return out


_SEG = re.compile(r'<seg\s+id\s*=\s*"?\s*(\d+)\s*"?\s*>(.*?)</seg>', re.S)


def iwslt_xml_segments(text):
    """Texts of the ``<seg id="N">`` elements, in file order, stripped; the
    right single quote is replaced by an apostrophe as fairseq's classic script
    did for the dev/test sets. The text is taken as it stands (no XML
    unescaping), again as the classic script did."""
    segs = [m.group(2).strip().replace("\u2019", "'") for m in _SEG.finditer(text)]
    if not segs:
        raise PrepareError('no <seg id="N"> elements found')
    return segs


# --- tokenization, cleaning, splitting -------------------------------------

_TOK = {}


def _tokenize_chunk(args):
    lang, lines = args
    tok = _TOK.get(lang)
    if tok is None:
        from sacremoses import MosesTokenizer

        tok = _TOK[lang] = MosesTokenizer(lang=lang)
    return [tok.tokenize(line, escape=True, return_str=True) if line.strip() else "" for line in lines]


def tokenize_lines(lines, lang, workers=WORKERS):
    """Moses tokenization (tokenizer.perl -l LANG with its defaults: escaping on,
    no aggressive hyphen splitting)."""
    chunk = 2000
    if workers <= 1 or len(lines) < 2 * chunk:
        return _tokenize_chunk((lang, lines))
    import multiprocessing as mp

    jobs = [(lang, lines[i:i + chunk]) for i in range(0, len(lines), chunk)]
    out = []
    with mp.get_context("fork").Pool(workers) as pool:
        for part in pool.imap(_tokenize_chunk, jobs):
            out.extend(part)
    return out


def filter_pairs(src, tgt, min_len=1, max_len=175, ratio=1.5):
    """Indices of the pairs that clean-corpus-n.perl MIN MAX -ratio RATIO keeps:
    both sides have MIN..MAX whitespace tokens and neither is more than RATIO
    times longer than the other."""
    if len(src) != len(tgt):
        raise PrepareError(f"sides differ in length: {len(src)} vs {len(tgt)} lines")
    keep = []
    for i, (s, t) in enumerate(zip(src, tgt)):
        ns, nt = len(s.split()), len(t.split())
        if ns < min_len or nt < min_len or ns > max_len or nt > max_len:
            continue
        if ns > ratio * nt or nt > ratio * ns:
            continue
        keep.append(i)
    return keep


def split_every(lines, n):
    """(kept, every): lines number n, 2n, 3n, ... (1-based) go to ``every``."""
    kept = [x for i, x in enumerate(lines, 1) if i % n]
    every = [x for i, x in enumerate(lines, 1) if not i % n]
    return kept, every


# --- sentencepiece -----------------------------------------------------------

def spm_train(prefix, vocab_size, files, max_sentences=4_000_000, seed=1):
    """Joint BPE over ``files``. Identity normalization, so pieces decode back
    to the tokenized text exactly; full character coverage."""
    import sentencepiece as spm

    try:
        spm.set_random_generator_seed(seed)
    except AttributeError:  # pragma: no cover - old sentencepiece
        pass
    n_lines = 0
    for f in files:
        with open(f, "rb") as fh:
            n_lines += sum(1 for _ in fh)
    kw = dict(
        input=",".join(str(f) for f in files),
        model_prefix=str(prefix),
        vocab_size=int(vocab_size),
        model_type="bpe",
        character_coverage=1.0,
        normalization_rule_name="identity",
        bos_id=-1,
        eos_id=-1,
        num_threads=WORKERS,
        minloglevel=2,
    )
    if n_lines > max_sentences:  # WMT-sized: learn on a seeded sample
        kw.update(input_sentence_size=max_sentences, shuffle_input_sentence=True)
    try:
        spm.SentencePieceTrainer.train(**kw)
    except RuntimeError as e:
        raise PrepareError(f"sentencepiece training failed: {str(e).strip().splitlines()[-1]}")


def spm_encode(model, lines):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    out = []
    step = 100_000
    for i in range(0, len(lines), step):
        pieces = sp.encode(lines[i:i + step], out_type=str, num_threads=WORKERS)
        out.extend(" ".join(p) for p in pieces)
    return out


# --- command line ------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(prog="prepare.py", description="text steps of scripts/prepare-*.sh")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("sha256")
    p.add_argument("file")
    p = sub.add_parser("iwslt-train")
    p.add_argument("inp")
    p.add_argument("out")
    p.add_argument("--classic", action="store_true")
    p = sub.add_parser("iwslt-xml")
    p.add_argument("out")
    p.add_argument("xml", nargs="+")
    p = sub.add_parser("tokenize")
    p.add_argument("--lang", required=True)
    p.add_argument("pairs", nargs="+", metavar="IN OUT")
    p = sub.add_parser("filter-pairs")
    for name in ("src", "tgt", "out_src", "out_tgt"):
        p.add_argument(name)
    p.add_argument("--min", type=int, default=1)
    p.add_argument("--max", type=int, default=175)
    p.add_argument("--ratio", type=float, default=1.5)
    p = sub.add_parser("lowercase")
    p.add_argument("pairs", nargs="+", metavar="IN OUT")
    p = sub.add_parser("split-every")
    p.add_argument("n", type=int)
    p.add_argument("inp")
    p.add_argument("keep_out")
    p.add_argument("every_out")
    p = sub.add_parser("check-aligned")
    p.add_argument("files", nargs="+")
    p = sub.add_parser("spm-train")
    p.add_argument("prefix")
    p.add_argument("vocab_size", type=int)
    p.add_argument("files", nargs="+")
    p = sub.add_parser("spm-encode")
    p.add_argument("model")
    p.add_argument("pairs", nargs="+", metavar="IN OUT")
    a = ap.parse_args(argv)
    pairs = list(zip(a.pairs[0::2], a.pairs[1::2])) if hasattr(a, "pairs") else []
    if hasattr(a, "pairs") and len(a.pairs) % 2:
        ap.error(f"{a.cmd}: expects IN OUT pairs, got an odd number of paths")

    try:
        if a.cmd == "sha256":
            print(sha256(a.file))
        elif a.cmd == "iwslt-train":
            write_lines(a.out, iwslt_train_lines(read_lines(a.inp), classic=a.classic))
        elif a.cmd == "iwslt-xml":
            segs, counts = [], []
            for xml in a.xml:
                a.inp = xml
                with open(xml, encoding="utf-8") as f:
                    try:
                        these = iwslt_xml_segments(f.read())
                    except PrepareError as e:
                        raise PrepareError(f"{xml}: {e}")
                segs += these
                counts.append(f"{os.path.basename(xml)}={len(these)}")
            write_lines(a.out, segs)
            print("iwslt-xml: " + " ".join(counts), file=sys.stderr)
        elif a.cmd == "tokenize":
            for inp, out in pairs:
                a.inp = inp
                write_lines(out, tokenize_lines(read_lines(inp), a.lang))
        elif a.cmd == "filter-pairs":
            src, tgt = read_lines(a.src), read_lines(a.tgt)
            try:
                keep = filter_pairs(src, tgt, a.min, a.max, a.ratio)
            except PrepareError as e:
                raise PrepareError(f"{a.src} / {a.tgt}: {e}")
            write_lines(a.out_src, [src[i] for i in keep])
            write_lines(a.out_tgt, [tgt[i] for i in keep])
            print(f"filter-pairs: kept {len(keep)} of {len(src)} pairs", file=sys.stderr)
        elif a.cmd == "lowercase":
            for inp, out in pairs:
                a.inp = inp
                write_lines(out, [x.lower() for x in read_lines(inp)])
        elif a.cmd == "split-every":
            kept, every = split_every(read_lines(a.inp), a.n)
            write_lines(a.keep_out, kept)
            write_lines(a.every_out, every)
        elif a.cmd == "check-aligned":
            counts = []
            for f in a.files:
                with open(f, "rb") as fh:
                    counts.append(sum(1 for _ in fh))
            if len(set(counts)) != 1:
                raise PrepareError(
                    "files are not line-aligned: "
                    + ", ".join(f"{f} has {c} lines" for f, c in zip(a.files, counts))
                )
        elif a.cmd == "spm-train":
            spm_train(a.prefix, a.vocab_size, a.files)
        elif a.cmd == "spm-encode":
            for inp, out in pairs:
                a.inp = inp
                write_lines(out, spm_encode(a.model, read_lines(inp)))
    except PrepareError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    except UnicodeDecodeError as e:
        print(f"ERROR: {getattr(a, 'inp', '')}: not UTF-8 text ({e})", file=sys.stderr)
        return 1
    except FileNotFoundError as e:
        print(f"ERROR: {e.filename}: no such file", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
