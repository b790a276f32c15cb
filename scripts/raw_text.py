"""A researcher's raw parallel text (scripts/prepare-text.sh): the files found, checked in one pass, read a line at a
time, sampled, the words of a line counted, and pairs written.
"""
import codecs
import gzip
import hashlib
import io
import random
import zlib
from pathlib import Path

import regex  # Unicode scripts (a fairseq dependency, in requirements.txt)

from textfiles import PrepareError

BOM = "\ufeff"
# A word: a run of characters between whitespace, and each character of the scripts written without spaces between
# words (Chinese, Japanese kana): one character is about a word there, a whole sentence would be one "word".
_WORD = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}]|[^\s\p{Han}\p{Hiragana}\p{Katakana}]+")


def count_words(line):
    """The words of a raw line: its whitespace tokens, each Han, Hiragana or Katakana character a word of its own."""
    return len(_WORD.findall(line))


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
    """The lines of a UTF-8 file (or .gz), split on "\\n" only, a "\\r" before it dropped (Windows line ends), a byte
    order mark that starts a line dropped (an editor's, or one of files joined by `cat`): every step reads the text
    here, so the model's input and the references of sacreBLEU are the same text."""
    with _open_binary(path) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="\n") as f:
        for line in f:
            line = line[:-1] if line.endswith("\n") else line
            line = line[:-1] if line.endswith("\r") else line
            yield line[1:] if line.startswith(BOM) else line


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


def check_not_blank(split, sides):
    """Refuses a valid or test split ({lang: path}) with a line that is empty or only whitespace on a side: fairseq
    would decode an empty source, sacreBLEU score against an empty reference."""
    for lang, path in sides.items():
        for number, line in enumerate(read_text(path), 1):
            if not line.strip():
                raise PrepareError(f"{split} line {number} ({lang}) is blank, in {path}: every {split} pair needs text "
                                   "on both sides; remove the pair from both files")
