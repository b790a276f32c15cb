"""Line-for-line ports of mosesdecoder's perl scripts (tokenizer.perl, normalize-punctuation.perl,
remove-non-printing-char.perl, clean-corpus-n.perl, lowercase.perl), so that no perl or mosesdecoder checkout is
needed. Where a Python library and the perl script disagree, the perl script wins: tests/test_prepare.py requires our
output to be byte-identical to the upstream scripts' (tests/fixtures/*-golden/).
"""
import itertools
import os
import re
import sys

import regex  # perl's Unicode character classes (a fairseq dependency, in requirements.txt)

from textfiles import PrepareError, check_aligned, chunks, count_lines, iter_lines, parallel, write_lines


# --- mosesdecoder scripts/tokenizer/tokenizer.perl --------------------------------------
#
# A port of tokenize() for tokenizer.perl's defaults (escaping on, no -a, -penn, -protected), languages other than
# fi/sv/ca/tdt/fr/it/ga/so. sacremoses is close but not identical: it lacks the final-dot rule of mosesdecoder
# 9fc964da7 (2018-11-07) and splits CJK characters, which perl's \p{IsAlnum} keeps together. Perl's classes are
# spelled out with the `regex` module's Unicode properties.

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

# Which mosesdecoder the tokenizer reproduces. "current": the HEAD that fairseq's prepare-iwslt14.sh clones
# (75d4c672e, 2021). "2017": the one google/seq2seq's wmt16_en_de.sh cloned in 2017, before 9fc964da7 ("split final
# dots unconditionally", 2018-11-07) and 4da86c360 ("rupees": 'Rs' an English nonbreaking prefix, 2019-11-05); nothing
# else in tokenizer.perl or the de/en prefix files changed in between.
MOSES_VERSIONS = ("current", "2017")


def _nonbreaking_prefixes(lang, moses):
    # sacremoses ships mosesdecoder's share/nonbreaking_prefixes files (for de and en identical to mosesdecoder HEAD);
    # parsed as tokenizer.perl's load_prefixes.
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
            raise PrepareError(f"tokenize: moses must be one of {MOSES_VERSIONS}, got {moses!r}")
        self.lang, self.aggressive, self.final_dot = lang, aggressive, moses == "current"
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
            for k, rep in (("en1", r"\1 ' \2"), ("en2", r"\1 ' \2"), ("en3", r"\1 ' \2"), ("en4", r"\1 '\2"),
                           ("en5", r"\1 '\2")):
                text = t[k].sub(rep, text)
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
        # perl: split(/\s/, $text) keeps empty fields between two spaces (they are the "next word" of the one before)
        # and drops trailing empty fields.
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


# --- mosesdecoder scripts/tokenizer/normalize-punctuation.perl --------------------------
#
# The perl script has no `use utf8` and no binmode: it rewrites the UTF-8 *bytes* of each line, newline included (it
# reads with <STDIN> and never chomps). So the port works on bytes with bytes regexes: \d is [0-9], \s is ASCII
# whitespace, [a-z] with /i is ASCII, [^<] is one byte and matches the newline (a closing quote after a final dot
# moves before it, unless the line is a file's last and has no newline). Rules in the script's order (mosesdecoder
# HEAD; before f6d7adde1, 2019-11-25, ‘ and ‚ became " instead of ').

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
    return [(re.compile(rule[0], re.I if len(rule) > 2 else 0), rule[1]) for rule in rules]


class PunctNormalizer:
    """normalize-punctuation.perl LANG on one line given with its newline (or without, for a last line that has none);
    returns the line as the script prints it."""

    def __init__(self, lang):
        self.rules = _np_rules(lang)

    def __call__(self, line):
        b = line.encode("utf-8")
        for pat, rep in self.rules:
            b = pat.sub(rep, b)
        return b.decode("utf-8")


# remove-non-printing-char.perl: chomp, every \p{C} (control, format, private use, surrogate, unassigned) -> one
# space, print with "\n". Perl 5.36 knows Unicode 14; the `regex` module's table may be newer, so a code point
# assigned after Unicode 14 (none in the WMT corpora of 2013-2017) would stay here where perl makes it a space.
_NON_PRINTING = regex.compile(r"\p{C}")


def remove_non_printing(line):
    if line.endswith("\n"):
        line = line[:-1]
    return _NON_PRINTING.sub(" ", line)


_TOK = {}


def _moses_chunk(args):
    lang, moses, aggressive, norm, rem, lines, last_has_nl = args
    tok = _TOK.get((lang, moses, aggressive)) or _TOK.setdefault((lang, moses, aggressive),
                                                                MosesTokenizer(lang, moses, aggressive))
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


def tokenize_file(inp, out, lang, moses="current", aggressive=False, norm=False, rem=False, workers=1,
                  chunk=2000):
    """`cat INP | [normalize-punctuation.perl LANG |] [remove-non-printing-char.perl |] tokenizer.perl [-a] -l LANG >
    OUT`. Whether the file's last line has a newline matters to normalize-punctuation.perl (see above), so files are
    processed one at a time, as fairseq's prepare-wmt14en2de.sh does."""
    MosesTokenizer(lang, moses, aggressive)  # fail early on a bad language
    with open(inp, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size:
            f.seek(-1, os.SEEK_END)
        last_has_nl = not size or f.read(1) == b"\n"
    parts = list(chunks(iter_lines(inp), chunk))
    jobs = ((lang, moses, aggressive, norm, rem, c, (k < len(parts) - 1) or last_has_nl)
            for k, c in enumerate(parts))
    write_lines(out, parallel(_moses_chunk, jobs, workers))


# --- mosesdecoder scripts/training/clean-corpus-n.perl ----------------------------------

def length_rule(fc, ec, min_len, max_len, ratio):
    """clean-corpus-n.perl's rule on a pair's token counts (at least one each): "length" (a side outside
    MIN_LEN..MAX_LEN), "ratio" (a side more than RATIO times longer than the other), or None (kept)."""
    if ec > max_len or fc > max_len or ec < min_len or fc < min_len:
        return "length"
    if ec / fc > ratio or fc / ec > ratio:
        return "ratio"
    return None


def clean_pairs(pairs, min_len, max_len, ratio=9.0, max_word_length=1000):
    """clean-corpus-n.perl [-ratio R] corpus src tgt out MIN MAX over (src, tgt) pairs: yields the kept pairs,
    *normalized* as the perl script writes them ('|' removed unless the first pair has one, whitespace runs to one
    space, trimmed); a pair is dropped if a side is empty, has fewer than MIN or more than MAX words, is more than R
    times longer than the other, or has a word over 1000 characters."""
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
        if length_rule(len(f.split(" ")), len(e.split(" ")), min_len, max_len, ratio):
            continue
        if long_word.search(e) or long_word.search(f):
            continue
        yield f, e


def clean_corpus(src, tgt, out_src, out_tgt, min_len, max_len, ratio=9.0):
    """clean-corpus-n.perl [-ratio R] on the line-aligned files SRC and TGT (ratio 9: its default)."""
    check_aligned(src, tgt)
    kept = 0
    with open(out_src, "w", encoding="utf-8", newline="\n") as fs, \
            open(out_tgt, "w", encoding="utf-8", newline="\n") as ft:
        for f, e in clean_pairs(zip(iter_lines(src), iter_lines(tgt)), min_len, max_len, ratio):
            fs.write(f + "\n")
            ft.write(e + "\n")
            kept += 1
    print(f"clean-corpus: kept {kept} of {count_lines(src)} pairs", file=sys.stderr)


# --- mosesdecoder scripts/tokenizer/lowercase.perl --------------------------------------

def perl_lc(line):
    """perl's lc(): Unicode full lowercase mapping, but no final-sigma rule (Python's str.lower() writes a word-final
    capital sigma as 'ς', perl as 'σ')."""
    return line.replace("\u03a3", "\u03c3").lower()


def lowercase_file(inp, out):
    """lowercase.perl < INP > OUT."""
    write_lines(out, map(perl_lc, iter_lines(inp)))
