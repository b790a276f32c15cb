"""scripts/prepare-text.sh (`python scripts/prepare.py text`): a researcher's own parallel corpus, raw text, checked
(raw_text.py), a joint SentencePiece model trained on a seeded sample of the training pairs, every split encoded to
pieces by several processes, the training pairs filtered, and binarized by fairseq-preprocess; text() runs the steps.
"""
import argparse
import collections
import contextlib
import inspect
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
from pathlib import Path

import raw_text
from moses import length_rule
from steps import preprocess_exe, run_preprocess, write_manifest
from textfiles import OptionParser, PrepareError, chunks, count_lines, parallel, whole_number

OWN_CORPUS = "own corpus (scripts/prepare-text.sh)"  # prepare.json's "dataset": --force replaces only such a folder
# fairseq's DEFAULT_MAX_SOURCE_POSITIONS and DEFAULT_MAX_TARGET_POSITIONS, those of the configs/text models: a
# sentence of more pieces (with the </s> fairseq appends) cannot be decoded, so cannot be scored
MAX_POSITIONS = 1024
VALID_SIZE, VALID_SHARE = 2000, 10  # the default held-out valid: 2,000 pairs, at most a tenth of the training pairs


def log(message):
    print(f"[text] {message}", file=sys.stderr, flush=True)


def text(o):
    """A researcher's own parallel corpus, raw UTF-8 text one sentence a line, binarized for SRC->TGT into DESTDIR:
    check (every file readable, UTF-8, not empty; the two sides of a split line-aligned; no blank valid or test line),
    held-out valid (without --validpref, a seeded sample of train: --valid-size pairs, by default 2,000 but at most a
    tenth), spm-train (one joint SentencePiece model on a seeded sample of the training pairs, DESTDIR/spm.model),
    encode (pieces, several processes; a valid or test line over the model's 1,023 pieces + </s> refused; training
    pairs outside --min-len..--max-len pieces or over --ratio in words dropped; valid and test kept whole), binarize
    (fairseq-preprocess --joined-dictionary), with the raw valid and test text (DESTDIR/raw/, the references of
    sacreBLEU) and prepare.json. Everything is made in a temporary folder beside DESTDIR, renamed to it at the end: a
    refused or failed run leaves nothing; --force replaces only a folder this script made."""
    src, tgt, dest = o.source_lang, o.target_lang, o.destdir
    prefixes = {"train": o.trainpref, "valid": o.validpref, "test": o.testpref}
    files = {split: {lang: raw_text.input_file(p, lang) for lang in (src, tgt)} for split, p in prefixes.items() if p}
    for path in (path for sides in files.values() for path in sides.values()):
        if dest in path.resolve().parents:  # replacing DESTDIR would delete the corpus
            raise PrepareError(f"--destdir {dest} holds the input {path}: name another folder")
    check_destination(dest, o.force)
    log(f"step check: {', '.join(str(f) for sides in files.values() for f in sides.values())}")
    inputs = raw_text.check_inputs(files)
    for split in ("valid", "test"):
        if split in files:
            raw_text.check_not_blank(split, files[split])
    n_train = inputs["train"]["pairs"]
    held = held_out(n_train, o)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        log(f"step spm-train: {o.model_type}, {o.vocab_size} pieces, on a sample of at most {o.sample_pairs} of "
            f"the {n_train - len(held)} training pairs (seed {o.seed})")
        sentences = raw_text.sample_pairs(files["train"][src], files["train"][tgt], o.sample_pairs, o.seed, held)
        train_model(tmp / "spm", sentences, o.vocab_size, o.model_type, o.character_coverage, o.workers)
        sample = len(sentences) // 2
        del sentences
        log(f"step encode: every split to pieces, valid and test first (at most {MAX_POSITIONS - 1} pieces a line), "
            "training pairs filtered")
        model, pieces, raw = tmp / "spm.model", tmp / "pieces", tmp / "raw"
        pieces.mkdir()
        raw.mkdir()
        sizes = {}
        for split in ("valid", "test") if o.validpref else ("test",):
            encode_whole(model, split, files[split], pieces, raw, o.workers)
            sizes[split] = {"pairs": inputs[split]["pairs"], "from": f"--{split}pref"}
        limits = (o.min_len, o.max_len, o.ratio)
        sizes["train"], valid = encode_train(model, files["train"], pieces, raw, held, limits, o.workers)
        if held:
            sizes["valid"] = {**valid, "from": f"{len(held)} pairs held out of --trainpref (seed {o.seed})"}
        note_filters(sizes["train"], limits)
        log("step binarize: fairseq-preprocess --joined-dictionary")
        run_preprocess(o.preprocess, ["--source-lang", src, "--target-lang", tgt, "--joined-dictionary"], pieces, tmp,
                       o.workers)
        shutil.rmtree(pieces)
        manifest = {
            "dataset": OWN_CORPUS, "source_lang": src, "target_lang": tgt,
            "bpe": "sentencepiece", "bpe_size": o.vocab_size, "remove_bpe": "sentencepiece", "lowercased": False,
            "sentencepiece": {"model": "spm.model", "model_type": o.model_type, "vocab_size": o.vocab_size,
                              "character_coverage": o.character_coverage, "trained_on_pairs": sample, "seed": o.seed},
            "filter": {"length_unit": "pieces", "min_len": o.min_len, "max_len": o.max_len,
                       "ratio_unit": "words (whitespace tokens; each Han or kana character one)", "ratio": o.ratio,
                       "applies_to": "train"},
            "max_positions": MAX_POSITIONS, "sizes": sizes, "references": {s: f"raw/{s}.{tgt}" for s in ("valid", "test")},
            "dictionary_size": 4 + count_lines(tmp / f"dict.{src}.txt"), "inputs": inputs, "versions": versions()}
        write_manifest(tmp, manifest, o.command)
        replace_folder(tmp, dest)
        kept = sizes["train"]
        log(f"done: {dest}: train {kept['pairs']} of {kept['input_pairs']} pairs (dropped: {kept['dropped']['length']} "
            f"by length, {kept['dropped']['ratio']} by ratio), valid {sizes['valid']['pairs']}, test "
            f"{sizes['test']['pairs']}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_destination(dest, force):
    """Refuses a --destdir that is a file, one that exists without --force, and, with it, one that holds anything but
    a folder prepare-text.sh made (its prepare.json): --force deletes it."""
    if dest.exists() and not dest.is_dir():
        raise PrepareError(f"--destdir {dest} is a file: name a folder")
    if not dest.exists():
        return
    if not force:
        raise PrepareError(f"{dest} exists: pass --force to replace it, or another --destdir")
    if not any(dest.iterdir()):
        return
    try:
        made = json.loads((dest / "prepare.json").read_text(encoding="utf-8")).get("dataset")
    except (OSError, ValueError, AttributeError):
        made = None
    if made != OWN_CORPUS:
        raise PrepareError(f"--force replaces only a folder prepare-text.sh made, and {dest} has no prepare.json of "
                           "it: delete the folder yourself, or name another --destdir")


def held_out(n_train, o):
    """The indices of the training pairs held out as valid (none with --validpref), a seeded sample."""
    if o.validpref:
        return frozenset()
    size = o.valid_size
    if size is None:
        size = min(VALID_SIZE, n_train // VALID_SHARE)
        if not size:
            raise PrepareError(f"--trainpref has {n_train} pairs, too few to hold a tenth out as valid: pass "
                               "--validpref")
        why = f"the default, {VALID_SIZE} but at most a tenth; --valid-size N or --validpref to choose"
    elif size * 2 > n_train:
        raise PrepareError(f"--valid-size {size} would hold out over half of the {n_train} training pairs of "
                           "--trainpref: pass a smaller --valid-size, or --validpref")
    else:
        why = "--valid-size"
    log(f"step valid: {size} of the {n_train} training pairs held out as valid (seed {o.seed}; {why})")
    return frozenset(random.Random(o.seed).sample(range(n_train), size))


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
    """(model, [(src, tgt)]) -> [[(src pieces, tgt pieces, (number of src pieces, of tgt pieces, src words, tgt
    words))]]: one item, the chunk's list, so that its results stay together."""
    model, pairs = job
    if model not in _PROCESSORS:
        import sentencepiece as spm
        _PROCESSORS[model] = spm.SentencePieceProcessor(model_file=model)
    src, tgt = (_PROCESSORS[model].encode([pair[k] for pair in pairs], out_type=str) for k in (0, 1))
    return [[(" ".join(s), " ".join(t), (len(s), len(t), *map(raw_text.count_words, pair)))
             for s, t, pair in zip(src, tgt, pairs)]]


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


def over_positions(counts):
    """The side (0: source, 1: target) of an encoded pair too long for the model, or None."""
    return next((k for k in (0, 1) if counts[k] + 1 > MAX_POSITIONS), None)


def encode_whole(model, split, sides, folder, raw, workers):
    """A valid or test split ({lang: path} ``sides``) to FOLDER/SPLIT.LANG (pieces) and RAW/SPLIT.LANG (its raw text),
    every pair kept; refuses a line longer than the model takes, naming it (cutting it would change what is scored)."""
    pairs = zip(*map(raw_text.read_text, sides.values()))
    langs = list(sides)
    with raw_text.PairFiles(folder / split, sides) as coded, raw_text.PairFiles(raw / split, sides) as text_out:
        for number, (pair, (s, t, counts)) in enumerate(encode_pairs(model, pairs, workers), 1):
            if (side := over_positions(counts)) is not None:
                raise PrepareError(f"{split} line {number} ({langs[side]}) is {counts[side]} pieces; the model takes "
                                   f"at most {MAX_POSITIONS - 1} + </s> (fairseq's max_source_positions and "
                                   f"max_target_positions, {MAX_POSITIONS}): split or shorten it in "
                                   f"{sides[langs[side]]}")
            text_out.write(pair)
            coded.write((s, t))


def filter_reason(counts, limits):
    """Why a training pair is dropped ("length", "ratio"; None: kept): clean-corpus-n.perl's rule, its length limits
    on pieces (what the model's positions count), its ratio on words as the perl script counts them (in pieces the
    ratio would depend on the vocabulary size: a small vocabulary cuts German into more pieces than English)."""
    n_src, n_tgt, words_src, words_tgt = counts
    min_len, max_len, ratio = limits
    return length_rule(n_src, n_tgt, min_len, max_len, math.inf) or length_rule(words_src, words_tgt, 1, math.inf,
                                                                                  ratio)


def encode_train(model, sides, folder, raw, held, limits, workers):
    """The training pairs to FOLDER/train (filtered by ``limits``: min_len, max_len, ratio), those of ``held`` to
    FOLDER/valid and RAW/valid (whole, but a pair blank on a side or too long for the model left out) -> the sizes of
    train and of the held-out valid."""
    dropped, kept, total, valid_pairs, left_out = {"length": 0, "ratio": 0}, 0, 0, 0, 0
    pairs = zip(*map(raw_text.read_text, sides.values()))
    with contextlib.ExitStack() as stack:
        train = stack.enter_context(raw_text.PairFiles(folder / "train", sides))
        if held:  # else --validpref's valid is written already
            valid = stack.enter_context(raw_text.PairFiles(folder / "valid", sides))
            valid_raw = stack.enter_context(raw_text.PairFiles(raw / "valid", sides))
        for i, (pair, (s, t, counts)) in enumerate(encode_pairs(model, pairs, workers)):
            total += 1
            if i in held:
                if not all(side.strip() for side in pair) or over_positions(counts) is not None:
                    left_out += 1
                    continue
                valid.write((s, t))
                valid_raw.write(pair)
                valid_pairs += 1
            elif reason := filter_reason(counts, limits):
                dropped[reason] += 1
            else:
                train.write((s, t))
                kept += 1
    if not kept:
        raise PrepareError(f"no training pair is left: {dropped['length']} outside --min-len {limits[0]} .. --max-len "
                           f"{limits[1]} pieces, {dropped['ratio']} over --ratio {limits[2]} in words")
    if held and not valid_pairs:
        raise PrepareError(f"every one of the {len(held)} pairs held out as valid is blank on a side or too long for "
                           "the model: pass --validpref, or another --seed")
    return ({"pairs": kept, "input_pairs": total - len(held), "dropped": dropped},
            {"pairs": valid_pairs, "left_out_blank_or_too_long": left_out})


def note_filters(train, limits):
    """A line for each filter that dropped more than 5% of the training pairs: what it dropped and the option."""
    what = {"length": f"a side outside --min-len {limits[0]} .. --max-len {limits[1]} pieces (at most "
                      f"{MAX_POSITIONS - 1})",
            "ratio": f"a side over --ratio {limits[2]} times the other's words: raise --ratio if your translations "
                     "differ this much"}
    for reason, n in train["dropped"].items():
        if n * 20 > train["input_pairs"]:
            log(f"warning: the {reason} filter dropped {n} of the {train['input_pairs']} training pairs "
                f"({100 * n / train['input_pairs']:.0f}%): {what[reason]}")


def replace_folder(tmp, dest):
    """TMP becomes DEST, an older DEST removed only once the new one is in place."""
    os.chmod(tmp, 0o755)  # mkdtemp's folder is private
    old = dest.with_name(f".{dest.name}.old") if dest.exists() else None
    if old:
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dest, old)
    os.rename(tmp, dest)
    if old:
        shutil.rmtree(old)


def versions():
    """The versions of what made the corpus."""
    from importlib import metadata

    dists = metadata.packages_distributions()
    return {"python": sys.version.split()[0], **{name: metadata.version(dists[name][0])
                                                 for name in ("sentencepiece", "fairseq") if name in dists}}


def fraction(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got '{text}'")
    return value


def ratio(text):
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a number of at least 1, got '{text}'")
    return value


def parse_options(argv):
    """The options of scripts/prepare-text.sh: fairseq-preprocess's names for what it shares with it."""
    ap = OptionParser(prog="scripts/prepare-text.sh", allow_abbrev=False, description=inspect.cleandoc(text.__doc__),
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("-s", "--source-lang", required=True, help="source language: the suffix of the source files")
    add("-t", "--target-lang", required=True, help="target language")
    add("--trainpref", required=True, help="training text: TRAINPREF.SRC and TRAINPREF.TGT (or .gz)")
    add("--validpref", help="validation text (default: pairs held out of the training text, --valid-size)")
    add("--testpref", required=True, help="test text; its raw target side is the reference of sacreBLEU")
    add("--destdir", type=Path, required=True, help="output folder, for fairseq-train")
    add("--vocab-size", type=whole_number, default=8000, help="SentencePiece pieces (default %(default)s)")
    # unigram: SentencePiece's default, and Kudo (2018) found it as good as BPE or better for NMT
    add("--model-type", default="unigram", choices=["unigram", "bpe"], help="SentencePiece model (default %(default)s)")
    add("--character-coverage", type=fraction, default=1.0,
        help="share of the characters the model covers; rarer ones become <unk> (default %(default)s; SentencePiece "
             "advises 0.9995 for Chinese or Japanese)")
    add("--sample-pairs", type=whole_number, default=500000,
        help="training pairs the SentencePiece model learns from, a seeded sample: memory bounded whatever the corpus "
             "(default %(default)s)")
    add("--valid-size", type=whole_number,
        help=f"pairs held out without --validpref (default {VALID_SIZE}, but at most a tenth of the training pairs)")
    add("--min-len", type=whole_number, default=1, help="training pairs with a side of fewer pieces are dropped "
        "(default %(default)s)")
    add("--max-len", type=whole_number, default=250, help="training pairs with a side of more pieces are dropped "
        f"(default %(default)s, as fairseq's prepare-iwslt17-multilingual.sh; at most {MAX_POSITIONS - 1})")
    add("--ratio", type=ratio, default=1.5, help="training pairs with a side more than RATIO times longer in words "
        "(whitespace tokens; each Han or kana character one) are dropped (default %(default)s, clean-corpus-n.perl "
        "-ratio of fairseq's prepare-iwslt14.sh)")
    add("--seed", type=int, default=1, help="seed of the held-out pairs and the sample (default %(default)s)")
    add("--workers", type=whole_number, default=os.cpu_count() or 1,
        help="processes that encode, threads of the SentencePiece trainer, fairseq-preprocess workers")
    add("--force", action="store_true", help="replace an existing --destdir that prepare-text.sh made")
    o = ap.parse_args(argv)
    if o.source_lang == o.target_lang:
        raise PrepareError(f"--source-lang and --target-lang are both '{o.source_lang}'")
    o.destdir = o.destdir.resolve()
    o.command = " ".join(["scripts/prepare-text.sh", *argv])
    if o.min_len > o.max_len:
        raise PrepareError(f"--min-len {o.min_len} is over --max-len {o.max_len}: no training pair could be kept")
    if o.max_len >= MAX_POSITIONS:
        raise PrepareError(f"--max-len {o.max_len}: the model takes at most {MAX_POSITIONS - 1} pieces + </s> "
                           f"(fairseq's max_source_positions, {MAX_POSITIONS}); pass at most {MAX_POSITIONS - 1}")
    o.preprocess = preprocess_exe()
    return o
