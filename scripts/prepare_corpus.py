"""The text steps that read the released formats: what a downloaded file is, fairseq's prepare-iwslt14.sh grep/sed
lines on IWSLT's XML, mosesdecoder's input-from-sgm.perl, the members and counts of the language-model corpora, and
subword-nmt.
"""
import codecs
import os
import re
import shutil
import tarfile
import zipfile
import zlib

from prepare_text import PrepareError, chunks, iter_lines, parallel, read_lines, write_lines

# --- what a downloaded file is ----------------------------------------------------

_MAGIC = ((0, b"\x1f\x8b", "gzip", "is a gzip file"), (0, b"BZh", "bzip2", "is a bzip2 file"),
          (0, b"\xfd7zXZ\x00", "xz", "is an xz file"), (0, b"PK\x03\x04", "zip", "is a zip archive"),
          (257, b"ustar", "tar", "is a tar archive"))


def sniff(path):
    """(kind, description) of a file from its first bytes."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        return "empty", "is empty"
    for at, magic, kind, desc in _MAGIC:
        if head[at:at + len(magic)] == magic:
            return kind, desc
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


# What each expected kind accepts (a "tar" step unpacks any compressed tar), and its name.
_ACCEPTS = {"gzip": ({"gzip"}, "a gzip archive (.tgz)"), "tar": ({"tar", "gzip", "bzip2", "xz"}, "a tar archive"),
            "text": ({"text"}, "a plain text file"), "zip": ({"zip"}, "a zip archive")}


def check_kind(path, kind, whole=False):
    """None if PATH is of KIND, else a description of what it is. Text is read whole, a zip's every member
    CRC-checked; with ``whole``, a tar's every member is read to the end (a gzip's CRC checked), as `tar -t` does."""
    got, desc = sniff(path)
    if got not in _ACCEPTS[kind][0]:
        return f"{desc}, not {_ACCEPTS[kind][1]}"
    if kind == "text":
        return _text_problem(path)
    try:
        if kind == "zip":
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
            return f"is corrupt or truncated ({bad} fails its CRC check)" if bad else None
        if whole:
            with tarfile.open(path) as t:
                for member in (m for m in t if m.isfile()):
                    data = t.extractfile(member)
                    while data.read(1 << 20):
                        pass
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
        return f"is corrupt or truncated ({e})"
    return None


def _text_problem(path):
    """None if the file is UTF-8 without NUL bytes, else what it is; read in chunks (the WikiText-103 training text is
    540 MB)."""
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


# GNU sed's \s in a UTF-8 locale (glibc [[:space:]]); only ever next to a tag, and the tokenizer trims Unicode
# whitespace afterwards anyway.
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


def iwslt_xml_file(xmls, out):
    """The <seg id> lines of the XML files XMLS, in the order given (fairseq's `cat`), -> OUT."""
    segs = []
    for xml in xmls:
        try:
            segs += iwslt_xml_lines(iter_lines(xml))
        except PrepareError as e:
            raise PrepareError(f"{xml}: {e}") from None
    write_lines(out, segs)


# --- mosesdecoder scripts/ems/support/input-from-sgm.perl ------------------------------

_SGM_OPEN_END = re.compile(r"<seg[^>]+>\s*$", re.I | re.A)
_SGM_OPEN = re.compile(r"<seg[^>]+>\s*(.*)\s*$", re.I | re.A | re.S)
_SGM_SEG = re.compile(r"<seg[^>]+>\s*(.*)\s*</seg>", re.I | re.A | re.S)
_ASCII_SPACE = re.compile(r"\s+", re.A)


def sgm_text(raw):
    """The segments of an .sgm file, one a line, as input-from-sgm.perl prints them. The perl script reads bytes (no
    binmode), so \\s is ASCII whitespace; a <seg> continued on later lines is joined without a separator ("chop" drops
    the newline); lines without a complete <seg ...>...</seg> are skipped."""
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



def sgm_file(inp, out):
    """input-from-sgm.perl < INP > OUT."""
    with open(inp, encoding="utf-8", newline="") as f:
        text = f.read()
    try:
        write_lines(out, sgm_text(text))
    except PrepareError as e:
        raise PrepareError(f"{inp}: {e}") from None


def split_every(n, inp, keep_out, every_out):
    """awk 'NR%n != 0' INP > KEEP_OUT; awk 'NR%n == 0' INP > EVERY_OUT."""
    lines = read_lines(inp)
    write_lines(keep_out, (x for i, x in enumerate(lines, 1) if i % n))
    write_lines(every_out, (x for i, x in enumerate(lines, 1) if not i % n))


# Characters other than \n that some readers take as line breaks (fairseq reads text with Python's universal newlines,
# subword-nmt with str.splitlines): in text that is not tokenized (the Stanford En-Vi files) they would shift one
# side.
_BREAKS = str.maketrans({c: " " for c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


def sanitize_breaks(inp, out):
    """INP -> OUT with those characters as spaces; returns how many lines held one."""
    lines = read_lines(inp)
    fixed = [x.translate(_BREAKS) for x in lines]
    write_lines(out, fixed)
    return sum(x != y for x, y in zip(lines, fixed))


# --- subword-nmt ------------------------------------------------------------------------

class _Cat:
    """`cat FILE...` as the text stream learn_bpe reads line by line (it takes the name '<stdin>' to mean: read
    sequentially). Our files end with a newline, so chaining their lines is what `cat` gives, without a copy of
    WMT16's 2.6 GB."""

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
    # process_line keeps leading/trailing whitespace exactly as apply_bpe.py does with the line it reads (newline
    # included)
    return [bpe.process_line(line + "\n")[:-1] for line in lines]


def bpe_apply(codes, inp, out, workers=1, chunk=5000):
    """subword-nmt apply-bpe -c CODES < INP > OUT (separator '@@', no vocabulary filter)."""
    write_lines(out, parallel(_bpe_chunk, ((codes, c) for c in chunks(iter_lines(inp), chunk)), workers))


# --- language-model corpora (PTB, WikiText-103) -------------------------------------

def extract_members(archive, members, out_dir):
    """Copy each member of a tar or zip ``archive`` to OUT_DIR/NAME, for ``members`` a list of (path in the archive,
    NAME); a leading "./" in the archive's names is ignored."""
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

    Counted as fairseq-preprocess reads the text (universal newlines, whitespace split): tokens = the words and one
    end of sentence a line (blank lines too), as its "N tokens" line and the published PTB and WikiText figures count
    them; vocabulary = the distinct words of the first file (train), plus the end of sentence, as published."""
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


def write_stats(path, stats):
    write_lines(path, (f"{k} {v}" for k, v in stats.items()))


def read_stats(path):
    return {k: int(v) for k, v in (line.split() for line in read_lines(path))}
