"""The steps of scripts/prepare-text.sh (a researcher's own parallel corpus, raw text): the inputs checked in one pass,
a joint SentencePiece model trained on a seeded sample of the training pairs, and every split encoded to pieces by
several processes, the training pairs filtered by length and ratio (prepare.py's text() runs them in order).
"""
import codecs
import collections
import gzip
import hashlib
import io
import random
import re
import zlib
from pathlib import Path

from textfiles import PrepareError, chunks, parallel


def input_file(prefix, lang):
    """PREFIX.LANG or PREFIX.LANG.gz (one of them)."""
    found = [p for p in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")) if p.is_file()]
    if not found:
        raise PrepareError(f"neither {prefix}.{lang} nor {prefix}.{lang}.gz exists (raw text, one sentence a line)")
    if len(found) == 2:
        raise PrepareError(f"both {prefix}.{lang} and {prefix}.{lang}.gz exist: keep one")
    return found[0]


def _open_binary(path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_text(path):
    """The lines of a UTF-8 file (or .gz), split on "\\n" only, a "\\r" before it dropped (Windows line ends)."""
    with _open_binary(path) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="\n") as f:
        for line in f:
            line = line[:-1] if line.endswith("\n") else line
            yield line[:-1] if line.endswith("\r") else line


def _bad_line(path):
    """(line number, reason) of the first line of PATH that is not UTF-8."""
    with _open_binary(path) as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return number, f"{e.reason} at byte {e.start + 1} of the line: {line[max(0, e.start - 8):e.start + 4]}"
    return number, "a multi-byte character cut at the end of the file"


def check_file(path):
    """(lines, bytes, sha256) of a text file read in blocks; refuses one that is empty, unreadable, or not UTF-8
    (naming its first bad line)."""
    digest, decoder, lines, size, last = hashlib.sha256(), codecs.getincrementaldecoder("utf-8")(), 0, 0, b""
    try:
        with _open_binary(path) as f:
            while block := f.read(1 << 20):
                digest.update(block)
                decoder.decode(block)
                lines, size, last = lines + block.count(b"\n"), size + len(block), block[-1:]
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        number, reason = _bad_line(path)
        raise PrepareError(f"{path}, line {number}: not UTF-8 text ({reason})") from None
    except (OSError, EOFError, zlib.error) as e:
        raise PrepareError(f"cannot read {path} ({' '.join(str(e).split())})") from None
    if size == 0:
        raise PrepareError(f"{path} is empty")
    return lines + (last != b"\n"), size, digest.hexdigest()


def check_inputs(files):
    """{split: {lang: path}} -> {split: {"pairs": N, lang: {"path", "bytes", "sha256"}}}; refuses a split whose two
    sides differ in line count (naming both)."""
    out = {}
    for split, sides in files.items():
        out[split] = {}
        for lang, path in sides.items():
            lines, size, sha = check_file(path)
            out[split][lang] = {"path": str(Path(path).resolve()), "lines": lines, "bytes": size, "sha256": sha}
        (a, sa), (b, sb) = ((lang, out[split][lang]) for lang in sides)
        if sa["lines"] != sb["lines"]:
            raise PrepareError(f"the {split} files are not line-aligned: {sides[a]} has {sa['lines']} lines, "
                               f"{sides[b]} has {sb['lines']}")
        out[split]["pairs"] = sa["lines"]
    return out


def sample_pairs(src, tgt, size, seed, skip=frozenset()):
    """A seeded uniform sample of SIZE training pairs (reservoir sampling: memory for SIZE pairs, whatever the corpus)
    -> its sentences, both sides; pairs whose index is in ``skip`` (held out for validation) are never drawn.
    SentencePiece's own input_sentence_size samples sentences, not pairs, so it could not skip those."""
    rng, kept, seen = random.Random(seed), [], 0
    for i, pair in enumerate(zip(read_text(src), read_text(tgt))):
        if i in skip:
            continue
        if seen < size:
            kept.append(pair)
        elif (j := rng.randrange(seen + 1)) < size:
            kept[j] = pair
        seen += 1
    return [side for pair in kept for side in pair]


class PairFiles:
    """PREFIX.SRC and PREFIX.TGT, written a pair a line."""

    def __init__(self, prefix, langs):
        self.files = [open(f"{prefix}.{lang}", "w", encoding="utf-8", newline="\n") for lang in langs]

    def write(self, pair):
        for f, line in zip(self.files, pair):
            f.write(line + "\n")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in self.files:
            f.close()


_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def train_model(prefix, sentences, vocab_size, model_type, character_coverage, threads):
    """PREFIX.model and PREFIX.vocab: one SentencePiece model of the sentences (both languages); a vocabulary the text
    cannot fill, or smaller than its characters, is refused with the size that works."""
    import sentencepiece as spm
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_prefix=str(prefix), vocab_size=vocab_size, model_type=model_type,
            character_coverage=character_coverage, num_threads=threads, minloglevel=1)
    except RuntimeError as e:
        if m := _TOO_HIGH.search(str(e)):
            raise PrepareError(f"--vocab-size {vocab_size}: the training text cannot fill {vocab_size} {model_type} "
                               f"pieces; the largest that works is {m[2]}") from None
        if m := _TOO_LOW.search(str(e)):
            raise PrepareError(f"--vocab-size {vocab_size} is smaller than the {m[2]} pieces the characters of the "
                               f"training text need (--character-coverage {character_coverage}); the smallest that "
                               f"works is {m[2]}") from None
        raise PrepareError(f"sentencepiece could not train: {' '.join(str(e).split())}") from None


_PROCESSORS = {}


def _encode_chunk(job):
    """(model, [(src, tgt)]) -> [[(src pieces, tgt pieces, number of src pieces, of tgt pieces)]]: one item, the
    chunk's list, so that its results stay together."""
    model, pairs = job
    if model not in _PROCESSORS:
        import sentencepiece as spm
        _PROCESSORS[model] = spm.SentencePieceProcessor(model_file=model)
    src, tgt = (_PROCESSORS[model].encode([pair[k] for pair in pairs], out_type=str) for k in (0, 1))
    return [[(" ".join(s), " ".join(t), len(s), len(t)) for s, t in zip(src, tgt)]]


def encode_pairs(model, pairs, workers, chunk=2000):
    """(raw pair, encoded pair) of each pair, in order: WORKERS processes encode chunks of CHUNK pairs while the pairs
    are read (the pool takes a chunk when a worker is free), so memory holds a few chunks whatever the corpus size."""
    sent = collections.deque()  # the chunks in flight, the oldest first

    def jobs():
        for block in chunks(pairs, chunk):
            sent.append(block)
            yield str(model), block
    for encoded in parallel(_encode_chunk, jobs(), workers):
        yield from zip(sent.popleft(), encoded)
