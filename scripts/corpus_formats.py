"""Readers of the released formats, each as the upstream script reads it: tar and zip archives, fairseq's
prepare-iwslt14.sh grep/sed/awk lines on IWSLT's tagged text and XML, mosesdecoder's input-from-sgm.perl, the Stanford
En-Vi text, and the counts of the language-model corpora as fairseq-preprocess reads them.
"""
import re
import shutil
import tarfile
import zipfile
import zlib

from textfiles import PrepareError, iter_lines, read_lines, write_lines


def extract(out, archive):
    """`tar -xf ARCHIVE -C OUT`: a truncated or damaged archive, or one of another kind, stops the run."""
    try:
        with tarfile.open(archive) as t:
            t.extractall(out, filter="data")
    except (tarfile.TarError, zlib.error, OSError, EOFError) as e:
        raise PrepareError(f"cannot extract {archive.resolve()} ({' '.join(str(e).split())}): pass --archive PATH "
                           "to a good copy, or delete it and re-run with --force to download it again") from None


def extract_members(archive, members, out_dir):
    """Copy each (PATH in the tar or zip ARCHIVE, NAME) of ``members`` to OUT_DIR/NAME; a "./" before PATH in the
    archive is ignored."""
    try:
        z = zipfile.is_zipfile(archive)
        with zipfile.ZipFile(archive) if z else tarfile.open(archive) as a:
            items = a.infolist() if z else [i for i in a.getmembers() if i.isfile()]
            found = {(i.filename if z else i.name).removeprefix("./"): i for i in items}
            for path, name in members:
                if path not in found:
                    raise PrepareError(f"{archive} holds no {path}: it is not the expected archive (it holds "
                                       f"{len(found)} files, e.g. {', '.join(sorted(found)[:3]) or 'none'})")
                with (a.open if z else a.extractfile)(found[path]) as src, open(out_dir / name, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, OSError, EOFError) as e:
        raise PrepareError(f"cannot read {archive} ({' '.join(str(e).split())}): not the expected archive, or "
                           "truncated; pass --archive PATH to a good copy") from None


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
    try:
        with open(inp, encoding="utf-8", newline="") as f:
            write_lines(out, sgm_text(f.read()))
    except (PrepareError, UnicodeDecodeError) as e:
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


def lm_stats(files):
    """{"SPLIT.lines": ..., "SPLIT.tokens": ..., "vocabulary": ...} of ``files`` (SPLIT, PATH, NAME for errors), counted
    as fairseq-preprocess reads text (universal newlines, whitespace split) and as PTB's and WikiText's figures are
    published: tokens = the words and one end of sentence a line (blank lines too); vocabulary = the distinct words of
    the first file (train) and the end of sentence."""
    stats, types = {}, set()
    for k, (split, path, name) in enumerate(files):
        lines = tokens = 0
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    words = line.split()
                    lines += 1
                    tokens += len(words) + 1
                    if k == 0:
                        types.update(words)
        except UnicodeDecodeError as e:
            raise PrepareError(f"{name} is not UTF-8 text ({e})") from None
        stats[f"{split}.lines"], stats[f"{split}.tokens"] = lines, tokens
    stats["vocabulary"] = len(types) + 1
    return stats
