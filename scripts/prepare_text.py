"""Text steps of scripts/prepare-*.sh: line-for-line ports of the upstream scripts that
made the papers' data (fairseq's prepare-iwslt14.sh, mosesdecoder's perl scripts), so that
no perl, sed or mosesdecoder checkout is needed; ``python scripts/prepare_text.py -h`` lists
the commands. It imports nothing from normplug (the scripts do not pay for torch or fairseq).
Each command writes whole files (the calling step renames its folder when done) and exits
non-zero with one ``ERROR:`` line on bad input. Where the upstream script and a Python
library disagree, the upstream script wins: tests/test_prepare.py requires our output to be
byte-identical to theirs (tests/fixtures/*-golden/).
"""
import argparse
import codecs
import datetime
import itertools
import json
import os
import re
import shutil
import sys
import tarfile
import zipfile
import zlib

import regex  # perl's Unicode character classes (a fairseq dependency, in requirements.txt)

WORKERS = max(1, int(os.environ.get("NORMPLUG_PREPARE_WORKERS", os.cpu_count() or 1)))


class PrepareError(Exception):
    pass


def iter_lines(path):
    """Lines split on "\\n" only, as perl, sed and awk read them (streamed: the
    WMT16 training text is 4.5M lines a side)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            yield line[:-1] if line.endswith("\n") else line


def read_lines(path):
    return list(iter_lines(path))


def chunks(lines, size):
    batch = []
    for line in lines:
        batch.append(line)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")


# --- what a downloaded file is ----------------------------------------------------

def sniff(path):
    """(kind, description) of a file from its first bytes."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        return "empty", "is empty"
    if head[:2] == b"\x1f\x8b":
        return "gzip", "is a gzip file"
    if head[:3] == b"BZh":
        return "bzip2", "is a bzip2 file"
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz", "is an xz file"
    if head[:4] == b"PK\x03\x04":
        return "zip", "is a zip archive"
    if head[257:262] == b"ustar":
        return "tar", "is a tar archive"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n").lower()
    if text.startswith(("<!doctype html", "<html")) or ("<html" in text and "<head" in text):
        return "html", "is an HTML page (a server's error, login or confirmation page?)"
    if b"\x00" in head:
        return "binary", "is binary data"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not just a character cut at the 4096th byte
            return "binary", "is not UTF-8 text"
    if text.startswith(("<?xml", "<mteval", "<srcset", "<refset", "<tstset")):
        return "xml", "is an XML file"
    return "text", "is plain text"


# What each expected kind accepts: a "tar" step unpacks any compressed tar.
_ACCEPTS = {"gzip": {"gzip"}, "tar": {"tar", "gzip", "bzip2", "xz"}, "text": {"text"}, "zip": {"zip"}}
_NAMES = {"gzip": "a gzip archive (.tgz)", "tar": "a tar archive", "text": "a plain text file",
          "zip": "a zip archive"}


def check_kind(path, kind):
    """None if ``path`` is of ``kind``, else a description of what it is."""
    got, desc = sniff(path)
    if got in _ACCEPTS[kind]:
        if kind == "zip":  # whole: every member read and its CRC checked, as `tar -t` for a tar
            try:
                with zipfile.ZipFile(path) as z:
                    bad = z.testzip()
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                return f"is corrupt or truncated ({e})"
            return f"is corrupt or truncated ({bad} fails its CRC check)" if bad else None
        if kind == "text":  # the whole file, not only its head: a truncated or binary tail
            return _text_problem(path)
        return None
    return f"{desc}, not {_NAMES[kind]}"


def _text_problem(path):
    """None if the file is UTF-8 without NUL bytes, else what it is; read in chunks (the
    WikiText-103 training text is 540 MB)."""
    decoder, done = codecs.getincrementaldecoder("utf-8")(), 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 22)
            pending = len(decoder.getstate()[0])  # bytes of a character cut at the last chunk's end
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                return f"is not UTF-8 text (byte {done - pending + e.start})"
            if not chunk:
                return None
            if b"\x00" in chunk:
                return "holds NUL bytes, not text"
            done += len(chunk)


# --- fairseq examples/translation/prepare-iwslt14.sh -----------------------------------

def iwslt_train_lines(lines):
    """The training text as fairseq's prepare-iwslt14.sh makes it:
        grep -v '<url>' | grep -v '<talkid>' | grep -v '<keywords>' |
        sed -e 's/<title>//g' | sed -e 's/<\\/title>//g' |
        sed -e 's/<description>//g' | sed -e 's/<\\/description>//g'
    so every other metadata line (<speaker>, <reviewer ...>, <doc ...>, ...) stays."""
    out = []
    for line in lines:
        if "<url>" in line or "<talkid>" in line or "<keywords>" in line:
            continue
        for tag in ("<title>", "</title>", "<description>", "</description>"):
            line = line.replace(tag, "")
        out.append(line)
    return out


# GNU sed's \s in a UTF-8 locale (glibc [[:space:]]); only ever next to a tag, and
# the tokenizer trims Unicode whitespace afterwards anyway.
_SED_SPACE = "[\t\n\x0b\x0c\r \u1680\u2000-\u2006\u2008-\u200a\u2028\u2029\u205f\u3000]"
_SEG_OPEN = re.compile('<seg id="[0-9]*">' + _SED_SPACE + "*")
_SEG_CLOSE = re.compile(_SED_SPACE + "*</seg>" + _SED_SPACE + "*")


def iwslt_xml_lines(lines):
    """The test text of one IWSLT .xml file as fairseq's prepare-iwslt14.sh makes it:
        grep '<seg id' | sed -e 's/<seg id="[0-9]*">\\s*//g' |
        sed -e 's/\\s*<\\/seg>\\s*//g' | sed -e "s/\\’/\\'/g"
    (no XML unescaping: '&amp;' stays, and the tokenizer escapes its '&' again)."""
    out = []
    for line in lines:
        if "<seg id" not in line:
            continue
        line = _SEG_OPEN.sub("", line)
        line = _SEG_CLOSE.sub("", line)
        out.append(line.replace("\u2019", "'"))
    if not out:
        raise PrepareError('no <seg id="N"> lines found')
    return out


# --- mosesdecoder scripts/ems/support/input-from-sgm.perl ------------------------------

_SGM_OPEN_END = re.compile(r"<seg[^>]+>\s*$", re.I | re.A)
_SGM_OPEN = re.compile(r"<seg[^>]+>\s*(.*)\s*$", re.I | re.A | re.S)
_SGM_SEG = re.compile(r"<seg[^>]+>\s*(.*)\s*</seg>", re.I | re.A | re.S)
_ASCII_SPACE = re.compile(r"\s+", re.A)


def sgm_text(raw):
    """The segments of an .sgm file, one a line, as input-from-sgm.perl prints them.
    The perl script reads bytes (no binmode), so \\s is ASCII whitespace; a <seg>
    continued on later lines is joined without a separator ("chop" drops the
    newline); lines without a complete <seg ...>...</seg> are skipped."""
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [x + "\n" for x in lines]
    if lines and not raw.endswith("\n"):
        lines[-1] = lines[-1][:-1] + "\n"  # perl's chop would eat a real character there
    out = []
    it = iter(lines)
    for line in it:
        line = line[:-1]
        while _SGM_OPEN_END.search(line):
            nxt = next(it, None)
            if nxt is None:
                break
            line += nxt[:-1]
        while _SGM_OPEN.search(line) and not _SGM_SEG.search(line):
            nxt = next(it, None)
            if nxt is None:
                break
            line += nxt[:-1]
        m = _SGM_SEG.search(line)
        if m:
            out.append(_ASCII_SPACE.sub(" ", m.group(1)).strip(" "))
    if not out:
        raise PrepareError("no <seg ...>...</seg> elements found")
    return out


# --- mosesdecoder scripts/tokenizer/tokenizer.perl --------------------------------------
#
# A port of tokenize() for tokenizer.perl's defaults (escaping on, no -a, -penn,
# -protected), languages other than fi/sv/ca/tdt/fr/it/ga/so. sacremoses is close but
# not identical: it lacks the final-dot rule of mosesdecoder 9fc964da7 (2018-11-07)
# and splits CJK characters, which perl's \p{IsAlnum} keeps together. Perl's
# classes are spelled out with the `regex` module's Unicode properties.

# perl's \s on character strings (binmode :utf8); Python's \s adds \x1c-\x1f
_PERL_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_ALNUM = r"\p{Alphabetic}\p{Nd}"  # \p{IsAlnum}
_ALPHA = r"\p{Alphabetic}"         # \p{IsAlpha}
_NUM = r"\p{N}"                    # \p{IsN}

_T = {
    "blank": regex.compile(f"[{_PERL_WS}]*"),
    "ws": regex.compile(f"[{_PERL_WS}]+"),
    "ws1": regex.compile(f"[{_PERL_WS}]"),
    "junk": regex.compile(r"[\x00-\x1f]"),
    "spaces": regex.compile(" +"),
    "special": regex.compile(f"([^{_ALNUM}{_PERL_WS}\\.'`,\\-])"),
    "multidot": regex.compile(r"\.([\.]+)"),
    "multidot2": regex.compile(r"DOTMULTI\.([^\.])"),
    "comma1": regex.compile(f"([^{_NUM}])[,]"),
    "comma2": regex.compile(f"[,]([^{_NUM}])"),
    "comma3": regex.compile(f"([{_NUM}])[,]$"),
    "en1": regex.compile(f"([^{_ALPHA}])[']([^{_ALPHA}])"),
    "en2": regex.compile(f"([^{_ALPHA}{_NUM}])[']([{_ALPHA}])"),
    "en3": regex.compile(f"([{_ALPHA}])[']([^{_ALPHA}])"),
    "en4": regex.compile(f"([{_ALPHA}])[']([{_ALPHA}])"),
    "en5": regex.compile(f"([{_NUM}])[']([s])"),
    "word_dot": regex.compile(f"([^{_PERL_WS}]+)\\."),
    "alpha": regex.compile(f"[{_ALPHA}]"),
    "lower_start": regex.compile(r"[\p{Lowercase}]"),
    "digit_start": regex.compile("[0-9]+"),
    "dot_quote": regex.compile(r"\.' ?$"),
    "hyphen": regex.compile(f"([{_ALNUM}])\\-(?=[{_ALNUM}])"),
}
_ESCAPES = (("&", "&amp;"), ("|", "&#124;"), ("<", "&lt;"), (">", "&gt;"), ("'", "&apos;"),
            ('"', "&quot;"), ("[", "&#91;"), ("]", "&#93;"))

# Which mosesdecoder the tokenizer reproduces. "current": the HEAD that fairseq's
# prepare-iwslt14.sh clones (75d4c672e, 2021). "2017": the one google/seq2seq's
# wmt16_en_de.sh cloned in 2017, before 9fc964da7 ("split final dots
# unconditionally", 2018-11-07) and 4da86c360 ("rupees": 'Rs' an English
# nonbreaking prefix, 2019-11-05); nothing else in tokenizer.perl or the de/en
# prefix files changed in between.
MOSES_VERSIONS = ("current", "2017")


def _nonbreaking_prefixes(lang, moses):
    # sacremoses ships mosesdecoder's share/nonbreaking_prefixes files (for de and
    # en identical to mosesdecoder HEAD); parsed as tokenizer.perl's load_prefixes.
    from sacremoses.corpus import NonbreakingPrefixes

    nb = NonbreakingPrefixes()
    try:
        items = list(nb.words(lang))
    except Exception:
        items = list(nb.words("en"))  # tokenizer.perl falls back to English
    prefixes = {}
    for item in items:
        m = re.match(r"(.*)[\s]+(#NUMERIC_ONLY#)", item)
        if m:
            prefixes[m.group(1)] = 2
        elif item and not item.startswith("#"):
            prefixes[item] = 1
    if moses == "2017" and lang == "en":
        prefixes.pop("Rs", None)
    return prefixes


class MosesTokenizer:
    """tokenizer.perl -l LANG (escaping on), one line at a time; ``aggressive``: -a."""

    def __init__(self, lang, moses="current", aggressive=False):
        if lang in ("fi", "sv", "ca", "tdt", "fr", "it", "ga", "so"):
            raise PrepareError(f"tokenize: language '{lang}' has rules this port does not carry")
        if moses not in MOSES_VERSIONS:
            raise PrepareError(f"tokenize: --moses must be one of {MOSES_VERSIONS}")
        self.lang = lang
        self.aggressive = aggressive
        self.final_dot = moses == "current"
        self.prefixes = _nonbreaking_prefixes(lang, moses)

    def __call__(self, line):
        t = _T
        if t["blank"].fullmatch(line):  # /^\s*$/: printed as it is
            return line
        text = t["ws"].sub(" ", " " + line + " ")
        text = t["junk"].sub("", text)
        text = t["spaces"].sub(" ", text)
        text = text[1:] if text.startswith(" ") else text
        text = text[:-1] if text.endswith(" ") else text
        text = t["special"].sub(r" \1 ", text)
        if self.aggressive:  # -a: "aggressive hyphen splitting", a-b -> a @-@ b
            text = t["hyphen"].sub(r"\1 @-@ ", text)
        text = t["multidot"].sub(r" DOTMULTI\1", text)
        while "DOTMULTI." in text:
            text = t["multidot2"].sub(r"DOTDOTMULTI \1", text)
            text = text.replace("DOTMULTI.", "DOTDOTMULTI")
        text = t["comma1"].sub(r"\1 , ", text)
        text = t["comma2"].sub(r" , \1", text)
        text = t["comma3"].sub(r"\1 ,", text)
        if self.lang == "en":
            text = t["en1"].sub(r"\1 ' \2", text)
            text = t["en2"].sub(r"\1 ' \2", text)
            text = t["en3"].sub(r"\1 ' \2", text)
            text = t["en4"].sub(r"\1 '\2", text)
            text = t["en5"].sub(r"\1 '\2", text)
        else:
            text = text.replace("'", " ' ")
        text = self._words(text)
        text = t["spaces"].sub(" ", text)
        text = text[1:] if text.startswith(" ") else text
        text = text[:-1] if text.endswith(" ") else text
        text = t["dot_quote"].sub(" . ' ", text, count=1)
        while "DOTDOTMULTI" in text:
            text = text.replace("DOTDOTMULTI", "DOTMULTI.")
        text = text.replace("DOTMULTI", ".")
        for a, b in _ESCAPES:
            text = text.replace(a, b)
        return text

    def _words(self, text):
        # perl: split(/\s/, $text) keeps empty fields between two spaces (they are
        # the "next word" of the one before) and drops trailing empty fields.
        words = _T["ws1"].split(text)
        while words and words[-1] == "":
            words.pop()
        last = len(words) - 1
        out = []
        for i, word in enumerate(words):
            m = _T["word_dot"].fullmatch(word)
            if m:
                pre = m.group(1)
                nxt = words[i + 1] if i < last else None
                if self.final_dot and i == last:
                    word = pre + " ."
                elif (("." in pre and _T["alpha"].search(pre)) or self.prefixes.get(pre) == 1
                      or (nxt is not None and _T["lower_start"].match(nxt))):
                    pass
                elif self.prefixes.get(pre) == 2 and nxt is not None and _T["digit_start"].match(nxt):
                    pass
                else:
                    word = pre + " ."
            out.append(word + " ")
        return "".join(out)


_TOK = {}


def _tokenize_chunk(args):
    lang, moses, lines = args
    tok = _TOK.get((lang, moses))
    if tok is None:
        tok = _TOK[(lang, moses)] = MosesTokenizer(lang, moses)
    return [tok(line) for line in lines]


def _parallel(func, jobs, workers):
    """func over an iterable of jobs (each returning a list), results in order."""
    if workers <= 1:
        for job in jobs:
            yield from func(job)
        return
    import multiprocessing as mp

    with mp.get_context("fork").Pool(workers) as pool:
        for part in pool.imap(func, jobs):
            yield from part


def tokenize_lines(lines, lang, moses="current", workers=WORKERS, chunk=2000):
    """An iterator of the tokenized ``lines`` (any iterable)."""
    MosesTokenizer(lang, moses)  # fail early on a bad language
    return _parallel(_tokenize_chunk, ((lang, moses, c) for c in chunks(lines, chunk)), workers)


# --- mosesdecoder scripts/tokenizer/normalize-punctuation.perl --------------------------
#
# The perl script has no `use utf8` and no binmode: it rewrites the UTF-8 *bytes* of each
# line, newline included (it reads with <STDIN> and never chomps). So the port works on
# bytes with bytes regexes: \d is [0-9], \s is ASCII whitespace, [a-z] with /i is ASCII,
# [^<] is one byte and matches the newline (a closing quote after a final dot moves before
# it, unless the line is a file's last and has no newline). Rules in the script's order
# (mosesdecoder HEAD; before f6d7adde1, 2019-11-25, ‘ and ‚ became " instead of ').

def _np_rules(lang):
    u = lambda c: c.encode("utf-8")
    nb = u("\u00a0")
    rules = [
        (rb"\r", b""),
        (rb"\(", b" ("), (rb"\)", b") "), (rb" +", b" "),
        (rb"\) ([\.\!\:\?\;\,])", rb")\1"),
        (rb"\( ", b"("), (rb" \)", b")"),
        (rb"(\d) \%", rb"\1%"), (rb" :", b":"), (rb" ;", b";"),
        (rb"`", b"'"), (rb"''", b' " '),                      # not -penn
        (u("„"), b'"'), (u("“"), b'"'), (u("”"), b'"'), (u("–"), b"-"),
        (u("—"), b" - "), (rb" +", b" "),
        (u("´"), b"'"),
        (rb"([a-z])" + u("‘") + rb"([a-z])", rb"\1'\2", True),
        (rb"([a-z])" + u("’") + rb"([a-z])", rb"\1'\2", True),
        (u("‘"), b"'"), (u("‚"), b"'"),
        (u("’"), b'"'), (rb"''", b'"'), (u("´´"), b'"'), (u("…"), b"..."),
        (nb + u("«") + nb, b' "'), (u("«") + nb, b'"'), (u("«"), b'"'),
        (nb + u("»") + nb, b'" '), (nb + u("»"), b'"'), (u("»"), b'"'),
        (nb + rb"\%", b"%"), (rb"n" + u("º") + nb, b"n" + u("º") + b" "), (nb + rb":", b":"),
        (nb + u("º") + b"C", b" " + u("º") + b"C"), (nb + b"cm", b" cm"), (nb + rb"\?", b"?"),
        (nb + rb"\!", b"!"), (nb + rb";", b";"), (rb"," + nb, b", "), (rb" +", b" "),
    ]
    if lang == "en":
        rules.append((rb'"([,\.]+)', rb'\1"'))
    elif lang not in ("cs", "cz"):
        rules += [(rb',"', b'",'), (rb'(\.+)"(\s*[^<])', rb'"\1\2')]
    sep = b"," if lang in ("de", "es", "cz", "cs", "fr") else b"."
    rules.append((rb"(\d)" + nb + rb"(\d)", rb"\1" + sep + rb"\2"))
    out = []
    for rule in rules:
        pat, rep = rule[0], rule[1]
        flags = re.I if len(rule) > 2 else 0
        out.append((re.compile(pat, flags), rep))
    return out


class PunctNormalizer:
    """normalize-punctuation.perl LANG on one line given with its newline (or without, for a
    last line that has none); returns the line as the script prints it."""

    def __init__(self, lang):
        self.rules = _np_rules(lang)

    def __call__(self, line):
        b = line.encode("utf-8")
        for pat, rep in self.rules:
            b = pat.sub(rep, b)
        return b.decode("utf-8")


# remove-non-printing-char.perl: chomp, every \p{C} (control, format, private use,
# surrogate, unassigned) -> one space, print with "\n". Perl 5.36 knows Unicode 14; the
# `regex` module's table may be newer, so a code point assigned after Unicode 14 (none in
# the WMT corpora of 2013-2017) would stay here where perl makes it a space.
_NON_PRINTING = regex.compile(r"\p{C}")


def remove_non_printing(line):
    if line.endswith("\n"):
        line = line[:-1]
    return _NON_PRINTING.sub(" ", line)


def _moses_chunk(args):
    lang, moses, aggressive, norm, rem, lines, last_has_nl = args
    key = (lang, moses, aggressive)
    tok = _TOK.get(key)
    if tok is None:
        tok = _TOK[key] = MosesTokenizer(lang, moses, aggressive)
    normalize = PunctNormalizer(lang) if norm else None
    out = []
    for i, line in enumerate(lines):
        if normalize is not None:
            nl = "\n" if (i < len(lines) - 1 or last_has_nl) else ""
            line = normalize(line + nl)
        if rem:
            line = remove_non_printing(line)
        elif line.endswith("\n"):
            line = line[:-1]
        out.append(tok(line))
    return out


def moses_pipeline(path, lang, moses="current", aggressive=False, norm=False, rem=False,
                   workers=WORKERS, chunk=2000):
    """`cat PATH | [normalize-punctuation.perl LANG |] [remove-non-printing-char.perl |]
    tokenizer.perl [-a] -l LANG`: an iterator of the output lines. Whether the file's last
    line has a newline matters to normalize-punctuation.perl (see above), so files are
    processed one at a time, as fairseq's prepare-wmt14en2de.sh does."""
    MosesTokenizer(lang, moses, aggressive)  # fail early on a bad language
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size:
            f.seek(-1, os.SEEK_END)
        last_has_nl = not size or f.read(1) == b"\n"
    parts = list(chunks(iter_lines(path), chunk))
    jobs = ((lang, moses, aggressive, norm, rem, c, (k < len(parts) - 1) or last_has_nl)
            for k, c in enumerate(parts))
    return _parallel(_moses_chunk, jobs, workers)


# --- mosesdecoder scripts/training/clean-corpus-n.perl ----------------------------------

def clean_pairs(pairs, min_len, max_len, ratio=9.0, max_word_length=1000):
    """clean-corpus-n.perl [-ratio R] corpus src tgt out MIN MAX over (src, tgt)
    pairs: yields the kept pairs, *normalized* as the perl script writes them ('|'
    removed unless the first pair has one, whitespace runs to one space, trimmed);
    a pair is dropped if a side is empty, has fewer than MIN or more than MAX
    words, is more than R times longer than the other, or has a word over 1000
    characters."""
    pairs = iter(pairs)
    first = next(pairs, None)
    if first is None:
        return
    factored = "|" in first[0] or "|" in first[1]
    long_word = regex.compile(f"[^{_PERL_WS}|]{{{max_word_length + 1}}}")

    def norm(x):
        if not factored:
            x = x.replace("|", "")
        x = _T["ws"].sub(" ", x)
        x = x[1:] if x.startswith(" ") else x
        return x[:-1] if x.endswith(" ") else x

    for f, e in itertools.chain([first], pairs):
        f, e = norm(f), norm(e)
        if not f or not e:
            continue
        fc, ec = len(f.split(" ")), len(e.split(" "))
        if ec > max_len or fc > max_len or ec < min_len or fc < min_len:
            continue
        if ec / fc > ratio or fc / ec > ratio:
            continue
        if long_word.search(e) or long_word.search(f):
            continue
        yield f, e


def zip_aligned(a, b, name_a, name_b):
    """zip of two line iterators that fails if one ends first (clean-corpus-n.perl:
    'is too short!' / 'is too long!')."""
    end = object()
    for x, y in itertools.zip_longest(a, b, fillvalue=end):
        if x is end or y is end:
            raise PrepareError(f"{name_a} and {name_b} differ in length")
        yield x, y


# --- mosesdecoder scripts/tokenizer/lowercase.perl --------------------------------------

def perl_lc(line):
    """perl's lc(): Unicode full lowercase mapping, but no final-sigma rule (Python's
    str.lower() writes a word-final capital sigma as 'ς', perl as 'σ')."""
    return line.replace("\u03a3", "\u03c3").lower()


def split_every(lines, n):
    """(kept, every): awk 'NR%n != 0' and awk 'NR%n == 0'."""
    kept = [x for i, x in enumerate(lines, 1) if i % n]
    every = [x for i, x in enumerate(lines, 1) if not i % n]
    return kept, every


# Characters other than \n that some readers take as line breaks (fairseq reads
# text with Python's universal newlines, subword-nmt with str.splitlines): in text
# that is not tokenized (the Stanford En-Vi files) they would shift one side.
_BREAKS = str.maketrans({c: " " for c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


# --- subword-nmt ------------------------------------------------------------------------

class _Cat:
    """`cat FILE...` as the text stream learn_bpe reads line by line (it takes the
    name '<stdin>' to mean: read sequentially). Our files end with a newline, so
    chaining their lines is what `cat` gives, without a copy of WMT16's 2.6 GB."""

    name = "<stdin>"

    def __init__(self, files):
        self.files = files

    def __iter__(self):
        for f in self.files:
            yield from iter_lines(f)


def bpe_learn(codes, merges, files):
    """subword-nmt learn-bpe -s MERGES < cat FILE... > CODES (min frequency 2)."""
    from subword_nmt.learn_bpe import learn_bpe

    with open(codes, "w", encoding="utf-8", newline="\n") as fout:
        learn_bpe(_Cat(files), fout, int(merges), min_frequency=2)


_BPE = {}


def _bpe_chunk(args):
    codes, lines = args
    bpe = _BPE.get(codes)
    if bpe is None:
        from subword_nmt.apply_bpe import BPE

        with open(codes, encoding="utf-8", newline="\n") as f:
            bpe = _BPE[codes] = BPE(f)
    # process_line keeps leading/trailing whitespace exactly as apply_bpe.py does
    # with the line it reads (newline included)
    return [bpe.process_line(line + "\n")[:-1] for line in lines]


def bpe_apply(codes, lines, workers=WORKERS, chunk=5000):
    """subword-nmt apply-bpe -c CODES (separator '@@', no vocabulary filter): an
    iterator of the segmented ``lines``."""
    return _parallel(_bpe_chunk, ((codes, c) for c in chunks(lines, chunk)), workers)


# --- language-model corpora (PTB, WikiText-103) -------------------------------------

def extract_members(archive, members, out_dir):
    """Copy each member of a tar or zip ``archive`` to OUT_DIR/NAME, for ``members`` a list
    of (path in the archive, NAME); a leading "./" in the archive's names is ignored."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            found = {i.filename.removeprefix("./"): i for i in z.infolist() if not i.is_dir()}
            _copy_members(archive, members, out_dir, found, z.open)
    else:
        with tarfile.open(archive) as t:
            found = {i.name.removeprefix("./"): i for i in t.getmembers() if i.isfile()}
            _copy_members(archive, members, out_dir, found, t.extractfile)


def _copy_members(archive, members, out_dir, found, open_member):
    for path, name in members:
        if path not in found:
            raise PrepareError(f"{archive} holds no {path}: it is not the expected archive "
                               f"(it holds {len(found)} files, e.g. {', '.join(sorted(found)[:3]) or 'none'})")
        with open_member(found[path]) as src, open(os.path.join(out_dir, name), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def lm_stats(paths):
    """{"NAME.lines": ..., "NAME.tokens": ...} for each (NAME, PATH) of ``paths``, and "vocabulary".

    Counted as fairseq-preprocess reads the text (universal newlines, whitespace split):
    tokens = the words and one end of sentence a line (blank lines too), as its "N tokens"
    line and the published PTB and WikiText figures count them; vocabulary = the distinct
    words of the first file (train), plus the end of sentence, as published."""
    stats, types = {}, set()
    for k, (name, path) in enumerate(paths):
        lines = tokens = 0
        with open(path, encoding="utf-8") as f:
            for line in f:
                words = line.split()
                lines += 1
                tokens += len(words) + 1
                if k == 0:
                    types.update(words)
        stats[f"{name}.lines"], stats[f"{name}.tokens"] = lines, tokens
    stats["vocabulary"] = len(types) + 1
    return stats


def read_stats(path):
    return {k: int(v) for k, v in (line.split() for line in read_lines(path))}


# --- prepare.json -------------------------------------------------------------------

# The value a config must pass to fairseq-generate --remove-bpe for each BPE type.
REMOVE_BPE = {"subword-nmt": "@@ ", "none": None}


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


SPLITS = ("train", "valid", "test")


def write_manifest(out, dataset, bpe, bpe_size, lowercased, text_dir, src, tgt, **common):
    """prepare.json of a translation corpus, next to the binarized data."""
    if bpe not in REMOVE_BPE:
        raise PrepareError(f"manifest: unknown bpe type '{bpe}'")
    _write_manifest(out, {
        "dataset": dataset,
        "source_lang": src,
        "target_lang": tgt,
        "bpe": bpe,
        "bpe_size": int(bpe_size) if bpe != "none" else None,
        "remove_bpe": REMOVE_BPE[bpe],
        "lowercased": bool(lowercased),
        "sizes": {s: count_lines(os.path.join(text_dir, f"{s}.{src}")) for s in SPLITS},
    }, **common)


def write_lm_manifest(out, dataset, stats, dictionary, **common):
    """prepare.json of a language-model corpus: sizes in lines, tokens as lm_stats counts
    them, and the size of fairseq's Dictionary (its 4 specials and the dict.txt entries,
    padding "madeupword"s included)."""
    st = read_stats(stats)
    _write_manifest(out, {
        "dataset": dataset,
        "bpe": "none",
        "remove_bpe": None,
        "sizes": {s: st[f"{s}.lines"] for s in SPLITS},
        "tokens": {s: st[f"{s}.tokens"] for s in SPLITS},
        "vocabulary": st["vocabulary"],
        "dictionary_size": 4 + count_lines(dictionary),
    }, **common)


def _write_manifest(out, info, sources, script, size_check="", extra=None):
    """prepare.json, next to the binarized data: what was made (``info``) and from what."""
    sums = {}
    if sources and os.path.exists(sources):
        for line in read_lines(sources):
            if line.strip():
                h, name = line.split(None, 1)
                sums[name.strip()] = h
    info.update({
        "size_check": size_check,
        "sources": sums,
        "script": script,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    })
    info.update(extra or {})
    with open(out, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2, ensure_ascii=False)
        f.write("\n")


# --- command line ------------------------------------------------------------------

# Exit status after an "ERROR: ..." line was printed (the calling script adds none).
REPORTED = 65


def _pairs(a):
    if len(a.pairs) % 2:
        raise PrepareError(f"{a.cmd}: expects IN OUT pairs, got an odd number of paths")
    return list(zip(a.pairs[0::2], a.pairs[1::2]))


def _map(a, convert):
    """IN OUT [IN OUT ...]: OUT = convert(the lines of IN)."""
    for a.inp, out in _pairs(a):
        write_lines(out, convert(iter_lines(a.inp)))


def _tokenize(a):
    for a.inp, out in _pairs(a):
        if a.aggressive or a.normalize_punctuation or a.remove_non_printing:
            write_lines(out, moses_pipeline(a.inp, a.lang, a.moses, a.aggressive,
                                            a.normalize_punctuation, a.remove_non_printing))
        else:
            write_lines(out, tokenize_lines(iter_lines(a.inp), a.lang, a.moses))


def _sanitize(lines, name):
    lines = list(lines)
    fixed = [x.translate(_BREAKS) for x in lines]
    n = sum(x != y for x, y in zip(lines, fixed))
    if n:
        print(f"sanitize-breaks: {name}: {n} lines held line-breaking characters other than \\n "
              "(now spaces)", file=sys.stderr)
    return fixed


def _iwslt_xml(a):
    segs, counts = [], []
    for a.inp in a.xml:
        try:
            these = iwslt_xml_lines(read_lines(a.inp))
        except PrepareError as e:
            raise PrepareError(f"{a.inp}: {e}")
        segs += these
        counts.append(f"{os.path.basename(a.inp)}={len(these)}")
    write_lines(a.out, segs)
    print("iwslt-xml: " + " ".join(counts), file=sys.stderr)


def _sgm_text(a):
    with open(a.inp, encoding="utf-8", newline="") as f:
        try:
            write_lines(a.out, sgm_text(f.read()))
        except PrepareError as e:
            raise PrepareError(f"{a.inp}: {e}")


def _clean_corpus(a):
    a.inp, counts = a.src, [0, 0]

    def counted(pairs):
        for pair in pairs:
            counts[0] += 1
            yield pair

    pairs = counted(zip_aligned(iter_lines(a.src), iter_lines(a.tgt), a.src, a.tgt))
    with open(a.out_src, "w", encoding="utf-8", newline="\n") as fs, \
            open(a.out_tgt, "w", encoding="utf-8", newline="\n") as ft:
        for f, e in clean_pairs(pairs, a.min, a.max, a.ratio):
            fs.write(f + "\n")
            ft.write(e + "\n")
            counts[1] += 1
    print(f"clean-corpus: kept {counts[1]} of {counts[0]} pairs", file=sys.stderr)


def _split_every(a):
    kept, every = split_every(read_lines(a.inp), a.n)
    write_lines(a.keep_out, kept)
    write_lines(a.every_out, every)


def _check_aligned(a):
    counts = [count_lines(f) for f in a.files]
    if len(set(counts)) != 1:
        raise PrepareError("files are not line-aligned: "
                           + ", ".join(f"{f} has {c} lines" for f, c in zip(a.files, counts)))


def _check_kind(a):
    why = check_kind(a.file, a.kind)
    if why:
        print(why)
        return 3


def _extract_members(a):
    a.inp = a.archive
    if len(a.members) % 2:
        raise PrepareError("extract-members: expects MEMBER NAME pairs, got an odd number")
    extract_members(a.archive, list(zip(a.members[0::2], a.members[1::2])), a.out_dir)


def _lm_stats(a):
    paths = [f.split("=", 1) for f in a.files]
    write_lines(a.out, [f"{k} {v}" for k, v in lm_stats(paths).items()])


def _common(a):
    return dict(sources=a.sources, script=a.script, size_check=a.size_check or "", extra=json.loads(a.extra))


PAIRS = ("pairs", dict(nargs="+", metavar="IN OUT"))
# what every prepare.json records (see _write_manifest)
MANIFEST_ARGS = [("out", {}), ("--dataset", dict(required=True)), ("--script", dict(required=True)),
                 ("--sources", {}), ("--size-check", {}),
                 ("--extra", dict(default="{}", help="JSON object merged into the manifest"))]
# command: (what it does, its arguments, what it runs)
COMMANDS = {
    "check-kind": ("is FILE what its step expects? If not, print what it is instead, exit 3",
                   [("file", {}), ("kind", dict(choices=sorted(_ACCEPTS)))], _check_kind),
    "iwslt-train": ("fairseq prepare-iwslt14.sh on train.tags.*", [("inp", {}), ("out", {})],
                    lambda a: write_lines(a.out, iwslt_train_lines(read_lines(a.inp)))),
    "iwslt-xml": ("fairseq prepare-iwslt14.sh on the *.xml test sets", [("out", {}), ("xml", dict(nargs="+"))],
                  _iwslt_xml),
    "sgm-text": ("mosesdecoder input-from-sgm.perl", [("inp", {}), ("out", {})], _sgm_text),
    "tokenize": ("mosesdecoder tokenizer.perl [-a] -l LANG, optionally after normalize-punctuation.perl LANG "
                 "| remove-non-printing-char.perl (fairseq's prepare-wmt14en2de.sh), file by file",
                 [("--lang", dict(required=True)), ("--moses", dict(default="current", choices=MOSES_VERSIONS)),
                  ("-a", dict(dest="aggressive", action="store_true", help="tokenizer.perl -a")),
                  ("--normalize-punctuation", dict(action="store_true", help="first normalize-punctuation.perl LANG")),
                  ("--remove-non-printing", dict(action="store_true", help="then remove-non-printing-char.perl")),
                  PAIRS], _tokenize),
    "clean-corpus": ("mosesdecoder clean-corpus-n.perl",
                     [("src", {}), ("tgt", {}), ("out_src", {}), ("out_tgt", {}),
                      ("--min", dict(type=int, required=True)), ("--max", dict(type=int, required=True)),
                      ("--ratio", dict(type=float, default=9.0))],  # clean-corpus-n.perl's default
                     _clean_corpus),
    "lowercase": ("mosesdecoder lowercase.perl", [PAIRS], lambda a: _map(a, lambda lines: map(perl_lc, lines))),
    "split-every": ("lines N, 2N, ... -> EVERY_OUT, the others -> KEEP_OUT",
                    [("n", dict(type=int)), ("inp", {}), ("keep_out", {}), ("every_out", {})], _split_every),
    "sanitize-breaks": ("line-breaking characters other than \\n -> space", [PAIRS],
                        lambda a: _map(a, lambda lines: _sanitize(lines, a.inp))),
    "check-aligned": ("fail unless all files have the same line count", [("files", dict(nargs="+"))],
                      _check_aligned),
    "bpe-learn": ("subword-nmt learn-bpe -s MERGES on FILE... concatenated",
                  [("codes", {}), ("merges", dict(type=int)), ("files", dict(nargs="+"))],
                  lambda a: bpe_learn(a.codes, a.merges, a.files)),
    "bpe-apply": ("subword-nmt apply-bpe -c CODES", [("codes", {}), PAIRS],
                  lambda a: _map(a, lambda lines: bpe_apply(a.codes, lines))),
    "manifest": ("write prepare.json of a translation corpus (see write_manifest)",
                 [*MANIFEST_ARGS, *[(f"--{k}", dict(required=True)) for k in ("bpe", "bpe-size", "text-dir", "src", "tgt")],
                  ("--lowercased", dict(type=int, choices=(0, 1), required=True))],
                 lambda a: write_manifest(a.out, a.dataset, a.bpe, a.bpe_size, a.lowercased, a.text_dir, a.src,
                                          a.tgt, **_common(a))),
    "extract-members": ("copy members of a tar or zip archive: MEMBER NAME pairs -> OUT_DIR/NAME",
                        [("archive", {}), ("out_dir", {}), ("members", dict(nargs="+", metavar="MEMBER NAME"))],
                        _extract_members),
    "lm-stats": ("lines, tokens (words + one end of sentence a line) of NAME=FILE..., and the vocabulary of "
                 "the first (its words + the end of sentence) -> OUT, one 'KEY VALUE' a line",
                 [("out", {}), ("files", dict(nargs="+", metavar="NAME=FILE"))], _lm_stats),
    "lm-manifest": ("write prepare.json of a language-model corpus (see write_lm_manifest)",
                    [*MANIFEST_ARGS, ("--stats", dict(required=True)), ("--dict", dict(required=True))],
                    lambda a: write_lm_manifest(a.out, a.dataset, a.stats, a.dict, **_common(a))),
}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="prepare_text.py", description="text steps of scripts/prepare-*.sh")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, (help, arguments, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help)
        for arg, options in arguments:
            p.add_argument(arg, **options)
    a = ap.parse_args(argv)
    a.inp = getattr(a, "inp", "")  # the file named in a UnicodeDecodeError message
    try:
        return COMMANDS[a.cmd][2](a) or 0
    except PrepareError as e:
        print(f"ERROR: {e}", file=sys.stderr)
    except UnicodeDecodeError as e:
        print(f"ERROR: {a.inp}: not UTF-8 text ({e})", file=sys.stderr)
    except FileNotFoundError as e:
        print(f"ERROR: {e.filename}: no such file", file=sys.stderr)
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError) as e:
        print(f"ERROR: {a.inp}: corrupt or truncated archive ({e})", file=sys.stderr)
    return REPORTED


if __name__ == "__main__":
    sys.exit(main())
