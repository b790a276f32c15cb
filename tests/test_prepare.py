"""scripts/prepare-*.sh on small archives in the upstream layouts, built here.

Every sentence carries a pair id (``x0042`` / ``ytst2010s3`` ...) on both sides,
so alignment, filtering, the valid split and the test concatenation can be
checked line by line. Nothing is downloaded: the archives are local, and the one
URL test points at a closed local port.
"""
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
BIN = Path(sys.executable).parent
HAVE_FAIRSEQ = (BIN / "fairseq-preprocess").exists()
needs_fairseq = pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq-preprocess not installed next to python")

WORDS_DE = ("die größe der straße ist schön und wir müssen über öl reden weil "
            "häuser bäume früher später gehen kommen sehen hören").split()
WORDS_EN = ("the size of the street is nice and we must talk about oil because "
            "houses trees earlier later go come see hear").split()


def run(script, *args, env=None, timeout=120):
    e = dict(os.environ)
    e["PYTHON"] = sys.executable
    e.pop("NORMPLUG_PREPARE_KILL_AT", None)
    e.update(env or {})
    return subprocess.run(
        ["bash", str(SCRIPTS / script), "--workers", "1", *map(str, args)],
        capture_output=True, text=True, env=e, timeout=timeout,
    )


def lines(path):
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def markers(work):
    state = Path(work) / ".state"
    return sorted(p.name for p in state.glob("*.done")) if state.exists() else []


def ids(line):
    return re.findall(r"\b(x\d{4}|y[a-z]+\d{4}s\d+)\b", line)


def add_file(tar, name, text):
    data = text.encode("utf-8")
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_400_000_000
    tar.addfile(info, io.BytesIO(data))


# --- IWSLT14 ---------------------------------------------------------------------

def sentence(words, i, n):
    """n whitespace tokens: the id, then words, ending with '.'."""
    body = [words[(i * 7 + k) % len(words)] for k in range(n - 2)]
    return " ".join([f"x{i:04d}"] + body + ["."])


def iwslt14_corpus():
    """Training pairs (de, en, expected to survive filtering) and test sets."""
    pairs = []
    for i in range(330):
        n = 3 + (i * 13) % 25
        de, en = sentence(WORDS_DE, i, n), sentence(WORDS_EN, i, n + (i % 3) - 1)
        keep = True
        if i % 41 == 5:  # too long: 176 tokens on the German side
            de, keep = sentence(WORDS_DE, i, 176), False
        elif i % 41 == 6:  # exactly 175 tokens on both sides: kept
            de, en = sentence(WORDS_DE, i, 175), sentence(WORDS_EN, i, 175)
        elif i % 41 == 7:  # ratio 2 > 1.5: dropped
            de, en, keep = sentence(WORDS_DE, i, 12), sentence(WORDS_EN, i, 6), False
        elif i % 41 == 8:  # ratio exactly 1.5: kept
            de, en = sentence(WORDS_DE, i, 9), sentence(WORDS_EN, i, 6)
        elif i % 41 == 9:  # Moses tokenization matters: "über," -> "über ,"
            de = f"x{i:04d} Straße, Größe & Öl: „Tschüß“ – wir sind's."
            en = f"x{i:04d} street, size & oil: \"bye\" - we're."
        elif i == 100:  # kept, and shows that case is lowered
            de, en = f"x{i:04d} ÜBER GRÖSSE .", f"x{i:04d} ABOUT SIZE ."
        pairs.append((de, en, keep))
    return pairs


TEST_SETS = [("TED", "dev2010", 4), ("TEDX", "dev2012", 3), ("TED", "tst2010", 5),
             ("TED", "tst2011", 2), ("TED", "tst2012", 6)]


def iwslt14_train_tags(pairs, lang):
    out = []
    talk = 0
    for i, (de, en, _) in enumerate(pairs):
        if i % 110 == 0:
            talk += 1
            title = {"de": f"Jörg Müller: Über Größe {talk}", "en": f"Jörg Müller: On size {talk}"}[lang]
            out += [
                f"<url>http://www.ted.com/talks/lang/{lang}/talk_{talk}.html</url>",
                "<keywords>talks, design, größe</keywords>",
                "<speaker>Jörg Müller</speaker>",
                f"<talkid>{talk}</talkid>",
            ]
            # title and description lines are text: they become training pairs
            out.append(f"<title>x{9000 + talk} {title}</title>")
            out.append(f"<description>x{9100 + talk} TED Talk Subtitles and Transcript: "
                       f"{'Über Größe' if lang == 'de' else 'About size'}.</description>")
            out += [f'<reviewer href="http://www.ted.com/profiles/{talk}">Anna Ölz</reviewer>',
                    f'<translator href="http://www.ted.com/profiles/{talk + 50}">Bernd Süß</translator>']
        out.append(de if lang == "de" else en)
    return "\n".join(out) + "\n"


def iwslt14_xml(kind, year, n, lang):
    setid = f"iwslt2014-{year}"
    head = (f'<srcset setid="{setid}" srclang="german">' if lang == "de"
            else f'<refset setid="{setid}" srclang="german" trglang="english" refid="ref">')
    tail = "</srcset>" if lang == "de" else "</refset>"
    words = WORDS_DE if lang == "de" else WORDS_EN
    segs = []
    for k in range(1, n + 1):
        text = f"y{year}s{k} " + " ".join(words[k:k + 4]) + (" Jörg’s ." if k == 2 else " .")
        segs.append(f'<seg id="{k}"> {text} </seg>')
    return "\n".join([
        '<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", head,
        f'<doc docid="{year}1" genre="lectures">',
        f"<url>http://www.ted.com/talks/{year}.html</url>",
        "<description>TED Talk Subtitles and Transcript: Größe</description>",
        "<keywords>talks</keywords>", f"<talkid>{year}</talkid>", "<title>Größe</title>",
        *segs, "</doc>", tail, "</mteval>",
    ]) + "\n"


def make_iwslt14_archive(path, pairs=None):
    pairs = pairs or iwslt14_corpus()
    with tarfile.open(path, "w:gz") as tar:
        for lang in ("de", "en"):
            add_file(tar, f"de-en/train.tags.de-en.{lang}", iwslt14_train_tags(pairs, lang))
            for kind, year, n in TEST_SETS:
                add_file(tar, f"de-en/IWSLT14.{kind}.{year}.de-en.{lang}.xml", iwslt14_xml(kind, year, n, lang))
        add_file(tar, "de-en/README", "IWSLT 2014 evaluation campaign, German-English\n")
    return path


def expected_iwslt14(pairs):
    kept = [f"x{i:04d}" for i, (_, _, keep) in enumerate(pairs) if keep]
    # title and description lines of each talk come first within the talk
    order = []
    talk = 0
    for i in range(len(pairs)):
        if i % 110 == 0:
            talk += 1
            order += [f"x{9000 + talk}", f"x{9100 + talk}"]
        if pairs[i][2]:
            order.append(f"x{i:04d}")
    valid = order[22::23]
    train = [x for k, x in enumerate(order, 1) if k % 23]
    test = [f"y{year}s{k}" for _, year, n in TEST_SETS for k in range(1, n + 1)]
    return train, valid, test, kept


@pytest.fixture(scope="module")
def iwslt14_archive(tmp_path_factory):
    return make_iwslt14_archive(tmp_path_factory.mktemp("iwslt14") / "de-en.tgz")


def check_iwslt14_split(work, pairs):
    train, valid, test, _ = expected_iwslt14(pairs)
    split = Path(work) / "split"
    for name, want in (("train", train), ("valid", valid), ("test", test)):
        de, en = lines(split / f"{name}.de"), lines(split / f"{name}.en")
        assert len(de) == len(en) == len(want), name
        got = [ids(x)[0] for x in de]
        assert got == want, name
        assert [ids(x)[0] for x in en] == want, name
        for x in de + en:
            assert x == x.lower()
            assert "<" not in x and "speaker" not in x and "ölz" not in x, x
    return train, valid, test


@needs_fairseq
def test_iwslt14_full_run_then_rerun_skips(tmp_path, iwslt14_archive):
    pairs = iwslt14_corpus()
    work, dest = tmp_path / "work", tmp_path / "bin"
    r = run("prepare-iwslt14.sh", "--archive", iwslt14_archive, "--work", work, "--dest", dest,
            "--bpe-size", 200)
    assert r.returncode == 0, r.stderr
    train, valid, test = check_iwslt14_split(work, pairs)
    assert len(valid) == (len(train) + len(valid)) // 23

    split = work / "split"
    # filtering: the 176-token and ratio-2 pairs are gone, the edge cases stay
    all_ids = set(train) | set(valid)
    for i, (_, _, keep) in enumerate(pairs):
        assert (f"x{i:04d}" in all_ids) == keep, i
    joined = "\n".join(lines(split / "train.de") + lines(split / "valid.de"))
    assert "straße , größe &amp; öl" in joined  # Moses tokenization with escaping, lowercased
    assert "x0100 über grösse ." in joined
    test_en = lines(split / "test.en")
    assert any("jörg 's" in x or "jörg &apos;s" in x for x in test_en)  # ’ -> ' then tokenized
    # title/description text kept, tags stripped
    assert any(x.startswith("x9001 jörg müller : über größe 1") for x in lines(split / "train.de") + lines(split / "valid.de"))

    # BPE: same line counts, decodes back to the split text
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(work / "spm" / "spm.model"))
    assert sp.get_piece_size() == 200
    for s in ("train", "valid", "test"):
        for lang in ("de", "en"):
            enc, ref = lines(work / "bpe" / f"{s}.{lang}"), lines(split / f"{s}.{lang}")
            assert len(enc) == len(ref)
            if s != "test":
                assert [sp.decode(x.split()) for x in enc] == ref
    # binarized
    for f in ("dict.de.txt", "dict.en.txt", "train.de-en.de.bin", "valid.de-en.en.idx",
              "test.de-en.de.bin", "spm.model", "preprocess.log", "prepare-info.txt"):
        assert (dest / f).exists(), f
    assert (dest / "dict.de.txt").read_bytes() == (dest / "dict.en.txt").read_bytes()
    assert (work / "archives" / "de-en.tgz.sha256").read_text().split()[0] == sha(iwslt14_archive)
    done = markers(work)
    assert done == sorted(f"{s}.done" for s in
                          ("fetch", "extract", "text", "tok", "split", "spm", "bpe", "binarize"))
    mtimes = {m: (work / ".state" / m).stat().st_mtime_ns for m in done}

    # second run: every step skipped, nothing rewritten
    r2 = run("prepare-iwslt14.sh", "--archive", iwslt14_archive, "--work", work, "--dest", dest,
             "--bpe-size", 200)
    assert r2.returncode == 0, r2.stderr
    assert r2.stderr.count("done before, skipping") == 8, r2.stderr
    assert "running" not in r2.stderr
    assert {m: (work / ".state" / m).stat().st_mtime_ns for m in markers(work)} == mtimes

    # a changed BPE size redoes spm and everything after it, not the text steps
    r3 = run("prepare-iwslt14.sh", "--archive", iwslt14_archive, "--work", work, "--dest", dest,
             "--bpe-size", 150, "--no-binarize")
    assert r3.returncode == 0, r3.stderr
    assert "step split: done before, skipping" in r3.stderr
    assert "step spm: running" in r3.stderr and "step bpe: running" in r3.stderr
    assert spm.SentencePieceProcessor(model_file=str(work / "spm" / "spm.model")).get_piece_size() == 150


def test_iwslt14_killed_mid_step_then_rerun(tmp_path, iwslt14_archive):
    pairs = iwslt14_corpus()
    work = tmp_path / "work"
    args = ("--archive", iwslt14_archive, "--work", work, "--bpe-size", 200, "--no-binarize")
    r = run("prepare-iwslt14.sh", *args, env={"NORMPLUG_PREPARE_KILL_AT": "split"})
    assert r.returncode in (-9, 137), (r.returncode, r.stderr)
    assert "killing this run inside step split" in r.stderr
    # the killed step left its half output in split.tmp but is not marked done
    assert markers(work) == ["extract.done", "fetch.done", "text.done", "tok.done"]
    assert (work / "split.tmp").exists() and not (work / "split").exists()
    r2 = run("prepare-iwslt14.sh", *args)
    assert r2.returncode == 0, r2.stderr
    assert "step tok: done before, skipping" in r2.stderr
    assert "step split: running" in r2.stderr
    assert not (work / "split.tmp").exists()
    check_iwslt14_split(work, pairs)
    assert markers(work) == sorted(f"{s}.done" for s in ("fetch", "extract", "text", "tok", "split", "spm", "bpe"))


def test_iwslt14_classic_clean_keeps_speaker_lines(tmp_path, iwslt14_archive):
    work = tmp_path / "work"
    r = run("prepare-iwslt14.sh", "--archive", iwslt14_archive, "--work", work, "--bpe-size", 200,
            "--no-binarize", "--classic-clean", env={"NORMPLUG_PREPARE_KILL_AT": "tok"})
    text = lines(work / "text" / "train.de")
    assert "<speaker>Jörg Müller</speaker>" in text
    assert not any("<url>" in x or "<talkid>" in x or "<keywords>" in x for x in text)
    assert any(x.startswith("x9001 Jörg Müller: Über Größe 1") for x in text)


def test_iwslt14_corrupt_archive(tmp_path, iwslt14_archive):
    bad = tmp_path / "de-en.tgz"
    data = Path(iwslt14_archive).read_bytes()
    bad.write_bytes(data[: len(data) // 2])  # truncated
    work = tmp_path / "work"
    r = run("prepare-iwslt14.sh", "--archive", bad, "--work", work, "--no-binarize")
    assert r.returncode != 0
    err = [x for x in r.stderr.splitlines() if x.startswith("ERROR")]
    assert len(err) == 1 and str(bad) in err[0] and "corrupt" in err[0] and "--archive" in err[0], r.stderr
    assert markers(work) == []
    assert not (work / "archives" / "de-en.tgz.sha256").exists()  # a bad copy is never pinned

    garbage = tmp_path / "garbage.tgz"
    garbage.write_bytes(os.urandom(5000))
    r = run("prepare-iwslt14.sh", "--archive", garbage, "--work", work, "--no-binarize")
    assert r.returncode != 0 and "corrupt or not a tar archive" in r.stderr
    assert markers(work) == []


def test_iwslt14_checksum_mismatch(tmp_path, iwslt14_archive):
    work = tmp_path / "work"
    r = run("prepare-iwslt14.sh", "--archive", iwslt14_archive, "--work", work, "--no-binarize",
            "--sha256", "0" * 64)
    assert r.returncode != 0
    assert "checksum mismatch" in r.stderr and str(iwslt14_archive) in r.stderr
    assert markers(work) == []
    # a pinned value from an earlier good copy is enforced on a different file
    other = make_iwslt14_archive(tmp_path / "other.tgz", iwslt14_corpus()[:200])
    (work / "archives").mkdir(exist_ok=True)
    (work / "archives" / "other.tgz.sha256").write_text(sha(iwslt14_archive) + "  other.tgz\n")
    r = run("prepare-iwslt14.sh", "--archive", other, "--work", work, "--no-binarize")
    assert r.returncode != 0 and "checksum mismatch" in r.stderr


def test_iwslt14_unreachable_url(tmp_path):
    work = tmp_path / "work"
    url = "http://127.0.0.1:9/x.tgz"
    r = run("prepare-iwslt14.sh", "--url", url, "--work", work, "--no-binarize", timeout=60)
    assert r.returncode != 0
    err = [x for x in r.stderr.splitlines() if x.startswith("ERROR")]
    assert len(err) == 1 and url in err[0] and "--archive" in err[0], r.stderr
    assert markers(work) == []


def test_iwslt14_file_url_download(tmp_path, iwslt14_archive):
    """A file:// URL goes through the download path (curl) and is then verified."""
    work = tmp_path / "work"
    r = run("prepare-iwslt14.sh", "--url", f"file://{iwslt14_archive}", "--work", work,
            "--no-binarize", env={"NORMPLUG_PREPARE_KILL_AT": "text"})
    assert "killing this run inside step text" in r.stderr, r.stderr
    assert (work / "archives" / "de-en.tgz").read_bytes() == Path(iwslt14_archive).read_bytes()
    assert markers(work) == ["extract.done", "fetch.done"]


# --- WMT16 -----------------------------------------------------------------------

def wmt16_sets():
    sets = {}
    for name, n in (("train", 60), ("newstest2013", 7), ("newstest2014", 9)):
        en = [f"x{k:04d} The street is nice , said Jörg &apos;s friend ." for k in range(n)]
        de = [f"x{k:04d} Die Straße ist schön , sagte Jörgs Freund ." for k in range(n)]
        sets[name] = (en, de)
    return sets


def bpe_google(line):
    return " ".join(w if len(w) <= 4 or w.startswith("x") else f"{w[:3]}@@ {w[3:]}" for w in line.split())


def make_wmt16_archive(path, drop=None):
    with tarfile.open(path, "w:gz") as tar:
        for name, (en, de) in wmt16_sets().items():
            tok = "tok.clean" if name == "train" else "tok"
            for lang, text in (("en", en), ("de", de)):
                files = {
                    f"{name}.{lang}": text,
                    f"{name}.{tok}.{lang}": text,
                    f"{name}.{tok}.bpe.32000.{lang}": [bpe_google(x) for x in text],
                }
                for fname, body in files.items():
                    if fname != drop:
                        add_file(tar, fname, "\n".join(body) + "\n")
        add_file(tar, "bpe.32000", "#version: 0.2\nt h\n")
        add_file(tar, "vocab.bpe.32000", "<unk>\n<s>\n</s>\nthe\n")
    return path


@needs_fairseq
def test_wmt16_google_bpe(tmp_path):
    archive = make_wmt16_archive(tmp_path / "wmt16_en_de.tar.gz")
    work, dest = tmp_path / "work", tmp_path / "bin"
    r = run("prepare-wmt16.sh", "--archive", archive, "--work", work, "--dest", dest)
    assert r.returncode == 0, r.stderr
    sets = wmt16_sets()
    for split, name in (("train", "train"), ("valid", "newstest2013"), ("test", "newstest2014")):
        for lang, k in (("en", 0), ("de", 1)):
            assert lines(work / "text" / f"{split}.{lang}") == [bpe_google(x) for x in sets[name][k]]
    assert not (work / "spm").exists()
    d = (dest / "dict.en.txt").read_text(encoding="utf-8")
    assert "str@@ " in d and d == (dest / "dict.de.txt").read_text(encoding="utf-8")
    log = (dest / "preprocess.log").read_text()
    assert "nwordssrc=32768" in log and "joined_dictionary=True" in log
    assert "train.en: 60 sents" in log and "valid.de: 7 sents" in log and "test.en: 9 sents" in log
    assert markers(work) == sorted(f"{s}.done" for s in ("fetch", "extract", "text", "binarize"))


def test_wmt16_spm_bpe_and_missing_file(tmp_path):
    archive = make_wmt16_archive(tmp_path / "wmt16_en_de.tar.gz")
    work = tmp_path / "work"
    r = run("prepare-wmt16.sh", "--archive", archive, "--work", work, "--bpe", "spm",
            "--bpe-size", 60, "--no-binarize")
    assert r.returncode == 0, r.stderr
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(work / "spm" / "spm.model"))
    sets = wmt16_sets()
    for split, name in (("train", "train"), ("valid", "newstest2013"), ("test", "newstest2014")):
        for lang, k in (("en", 0), ("de", 1)):
            enc = lines(work / "bpe" / f"{split}.{lang}")
            assert [sp.decode(x.split()) for x in enc] == sets[name][k]  # cased, as in the archive

    broken = make_wmt16_archive(tmp_path / "broken.tar.gz", drop="newstest2014.tok.bpe.32000.de")
    r = run("prepare-wmt16.sh", "--archive", broken, "--work", tmp_path / "w2", "--no-binarize")
    assert r.returncode != 0
    err = [x for x in r.stderr.splitlines() if x.startswith("ERROR")]
    assert len(err) == 1 and "newstest2014.tok.bpe.32000.de is missing" in err[0], r.stderr
    assert "text.done" not in markers(tmp_path / "w2")


# --- IWSLT15 En-Vi ------------------------------------------------------------------

ENVI_FILES = {"train": 50, "tst2012": 6, "tst2013": 8}


def make_envi_dir(path):
    path.mkdir(parents=True, exist_ok=True)
    for name, n in ENVI_FILES.items():
        en = [f"x{k:04d} It &apos;s a {name} about Hanoi ." for k in range(n)]
        vi = [f"x{k:04d} Đây là một câu chuyện về Hà Nội , {name} ." for k in range(n)]
        (path / f"{name}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
        (path / f"{name}.vi").write_text("\n".join(vi) + "\n", encoding="utf-8")
    (path / "vocab.en").write_text("<unk>\n<s>\n</s>\nIt\n", encoding="utf-8")
    return path


def test_iwslt15_envi_folder(tmp_path):
    # (binarization is the shared pl_binarize, exercised by the IWSLT14 and WMT16 tests)
    src = make_envi_dir(tmp_path / "stanford")
    work, dest = tmp_path / "work", tmp_path / "bin"
    r = run("prepare-iwslt15-envi.sh", "--archive", src, "--work", work, "--dest", dest, "--bpe-size", 80,
            "--no-binarize")
    assert r.returncode == 0, r.stderr
    for split, name in (("train", "train"), ("valid", "tst2012"), ("test", "tst2013")):
        for lang in ("en", "vi"):
            assert lines(work / "text" / f"{split}.{lang}") == lines(src / f"{name}.{lang}")
        en, vi = lines(work / "bpe" / f"{split}.en"), lines(work / "bpe" / f"{split}.vi")
        assert len(en) == len(vi) == ENVI_FILES[name]
        assert [ids(x) for x in lines(work / "text" / f"{split}.en")] == \
            [ids(x) for x in lines(work / "text" / f"{split}.vi")]
    assert (work / "bpe" / "spm.model").exists() and not dest.exists()
    for name in ("train.en", "tst2013.vi"):
        assert (work / "archives" / f"{name}.sha256").read_text().split()[0] == sha(src / name)
    # a file changed after its checksum was pinned is refused
    (src / "tst2013.vi").write_text("x0000 khác .\n", encoding="utf-8")
    r = run("prepare-iwslt15-envi.sh", "--archive", src, "--work", work, "--dest", dest,
            "--bpe-size", 80, "--force", "--no-binarize")
    assert r.returncode != 0 and "checksum mismatch" in r.stderr and "tst2013.vi" in r.stderr
    assert markers(work) == []


def test_iwslt15_envi_tarball_lowercase_words(tmp_path):
    src = make_envi_dir(tmp_path / "stanford")
    archive = tmp_path / "iwslt15.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname="iwslt15.en-vi")
    work = tmp_path / "work"
    r = run("prepare-iwslt15-envi.sh", "--archive", archive, "--work", work, "--bpe-size", 0,
            "--lowercase", "--no-binarize")
    assert r.returncode == 0, r.stderr
    assert lines(work / "text" / "train.vi") == [x.lower() for x in lines(src / "train.vi")]
    assert lines(work / "text" / "test.en") == [x.lower() for x in lines(src / "tst2013.en")]
    assert "note: train has 50 pairs, the Stanford release has 133317" in r.stderr
    assert not (work / "spm").exists()

    (src / "tst2012.vi").unlink()
    r = run("prepare-iwslt15-envi.sh", "--archive", src, "--work", tmp_path / "w2", "--no-binarize")
    assert r.returncode != 0
    assert "tst2012.vi not found" in r.stderr
