"""Scores of a checkpoint: translation (tokenized BLEU as the papers scored, sacreBLEU beside it) and
language models (perplexity, fairseq's sliding window beside it)."""
import re
import shlex
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .commands import eval_lm_argv, generate_argv, run_checked, write_atomic
from .config import ConfigError, Recipe, raw_references_path


def parse_generate(text: str) -> Tuple[List[str], List[str]]:
    """(hypotheses, references) from fairseq-generate's output, in sentence-id order."""
    hyps, refs = {}, {}
    for line in text.splitlines():
        fields = line.split("\t")
        m = re.fullmatch(r"([HT])-(\d+)", fields[0])
        if m:  # H-<id> <tab> score <tab> text; T-<id> <tab> text (an empty text may lose its field)
            n = 2 if m[1] == "H" else 1
            (hyps if m[1] == "H" else refs)[int(m[2])] = fields[n] if len(fields) > n else ""
    if set(refs) - set(hyps):
        raise RuntimeError(f"fairseq-generate gave no hypothesis for {len(set(refs) - set(hyps))} sentence(s)")
    ids = sorted(refs)
    return [hyps[i] for i in ids], [refs[i] for i in ids]


def compound_split(line: str) -> str:
    """fairseq's compound_split_bleu.sh: ``a-b`` -> ``a ##AT##-##AT## b`` (Perl ``s///g``)."""
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line)


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], lowercase=False, split=False):
    """(BLEU, result string) of tokenized text by fairseq's scorer (multi-bleu.perl's), as the papers did."""
    from fairseq.data import Dictionary
    from fairseq.scoring.bleu import BleuConfig, Scorer
    d = Dictionary()
    scorer = Scorer(BleuConfig(pad=d.pad(), eos=d.eos(), unk=d.unk()))
    for ref, hyp in zip(refs, hyps):
        if lowercase:
            ref, hyp = ref.lower(), hyp.lower()
        if split:
            ref, hyp = compound_split(ref), compound_split(hyp)
        scorer.add(d.encode_line(ref, add_if_not_exist=True), d.encode_line(hyp, add_if_not_exist=True))
    return scorer.score(4), scorer.result_string(4)


def detokenize(lines: Sequence[str], lang: str) -> List[str]:
    """Moses-detokenize (sacremoses), as fairseq's scripts/sacrebleu.sh does before scoring."""
    from sacremoses import MosesDetokenizer
    md = MosesDetokenizer(lang=lang)
    return [md.detokenize(line.split()) for line in lines]


def official_references(test_set: str, langpair: str) -> List[str]:
    """A sacrebleu test set's references, fetched once into ``$SACREBLEU``."""
    import sacrebleu.utils
    try:
        (ref_file,) = sacrebleu.utils.get_reference_files(test_set, langpair)
    except (OSError, SystemExit) as err:  # URLError offline; sacrebleu exits on SSL/md5 errors
        raise RuntimeError(f"cannot fetch the official {test_set} {langpair} references ({' '.join(str(err).split())}"
                           f"); offline, copy {Path(sacrebleu.utils.SACREBLEU_DIR) / test_set} from a machine where "
                           f"`sacrebleu -t {test_set} -l {langpair} --echo ref > /dev/null` has run") from None
    with open(ref_file, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def score(recipe: Recipe, hyps: Sequence[str], refs: Sequence[str],
          official: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Tokenized BLEU (the published metric), and sacreBLEU of the detokenized hypotheses against the
    ``official`` references or the binarized test set's, detokenized."""
    ev = recipe.evaluate
    tok, detail = tokenized_bleu(hyps, refs, lowercase=ev["lowercase"], split=ev["compound_split"])
    case = "lowercased" if ev["lowercase"] else "cased"
    if official is None:
        sacre_refs, label = detokenize(refs, recipe.detok_lang), f"{case} references of the binarized test set, " \
            "sacremoses-detokenized"
    else:
        test_set, pair = ev["sacrebleu_test_set"], f"{recipe.source_lang}-{recipe.target_lang}"
        if len(official) != len(hyps):
            raise ConfigError(f"the binarized {ev['gen_subset']} set has {len(hyps)} sentences, the "
                               f"official {test_set} {pair} references {len(official)}: sacreBLEU "
                               "needs the same test set, in its order")
        sacre_refs, label = official, f"official {test_set} {pair} references ({case})"
    from sacrebleu.metrics import BLEU
    bleu = BLEU(lowercase=ev["lowercase"])
    detok = detokenize(hyps, recipe.detok_lang)
    sacre = bleu.corpus_score(detok, [list(sacre_refs)]).score
    return {"hypotheses_scored": detok, "references_scored": list(sacre_refs),
            "tokenized_bleu": round(tok, 2), "tokenized_bleu_detail": detail,
            "tokenized_bleu_settings": {k: ev[k] for k in ("lowercase", "compound_split", "remove_bpe")},
            "sacrebleu": round(sacre, 2), "sacrebleu_signature": str(bleu.get_signature()),
            "sacrebleu_references": label}


def score_detokenized(recipe: Recipe, hyps: Sequence[str], refs: Sequence[str], label: str) -> Dict[str, object]:
    """sacreBLEU (its tokenizer for the target language) and chrF of detokenized hypotheses against raw references."""
    from sacrebleu.metrics import BLEU, CHRF
    if len(refs) != len(hyps):
        raise ConfigError(f"fairseq-generate decoded {len(hyps)} sentences of the {recipe.evaluate['gen_subset']} "
                           f"split, and {label} has {len(refs)} lines: not the text of that split")
    bleu, chrf = BLEU(trg_lang=recipe.target_lang), CHRF()
    return {"hypotheses_scored": list(hyps), "references_scored": list(refs),
            "sacrebleu": round(bleu.corpus_score(hyps, [list(refs)]).score, 2),
            "sacrebleu_signature": str(bleu.get_signature()), "sacrebleu_references": label,
            "chrf": round(chrf.corpus_score(hyps, [list(refs)]).score, 2), "chrf_signature": str(chrf.get_signature())}


def score_translation(recipe: Recipe, checkpoint: Path, ckdir: Path, gpu=None, log=print):
    """Decode the split with fairseq-generate and score it (:func:`score`; :func:`score_detokenized` against
    the raw references of a scripts/prepare-text.sh corpus). The hypotheses and references sacreBLEU scored
    are written beside the scores (hypotheses-<name>.txt, references-<name>.txt) for paired tests."""
    from .runs import scores_path
    test_set = recipe.evaluate["sacrebleu_test_set"]  # fetched before decoding: offline fails at once
    official = official_references(test_set, f"{recipe.source_lang}-{recipe.target_lang}") if test_set else None
    argv = generate_argv(recipe, checkpoint, gpu=gpu)
    log("$ " + shlex.join(argv))
    hyps, refs = parse_generate(run_checked(argv, "fairseq-generate", scores_path(recipe, ckdir, "generate", ".txt")))
    if recipe.evaluate["raw_references"]:
        path = raw_references_path(recipe)
        with open(path, encoding="utf-8", newline="\n") as f:
            raw = [line[:-1] if line.endswith("\n") else line for line in f]
        scores = {"sentences": len(hyps), **score_detokenized(recipe, hyps, raw, f"raw references {path}")}
        log(f"{recipe.name}: sacreBLEU {scores['sacrebleu']:.2f} {scores['sacrebleu_signature']}; chrF "
            f"{scores['chrf']:.2f} {scores['chrf_signature']} (against {path})")
    else:
        scores = {"sentences": len(hyps), **score(recipe, hyps, refs, official)}
        log(f"{recipe.name}: tokenized BLEU {scores['tokenized_bleu']:.2f} ({scores['tokenized_bleu_detail']})")
        log(f"{recipe.name}: sacreBLEU {scores['sacrebleu']:.2f} on the {scores['sacrebleu_references']}  "
            f"{scores['sacrebleu_signature']}")
    for kind in ("hypotheses", "references"):
        path = scores_path(recipe, ckdir, kind, ".txt")
        write_atomic(path, "".join(line + "\n" for line in scores.pop(kind + "_scored")))
        scores[kind] = path.name
    return scores


def measure_tid(recipe: Recipe, checkpoint: Path, gpu=None, log=print) -> Dict[str, object]:
    """TID of a BN/PN model (normplug-tid) on the first validation split at the training batch size (TID grows as
    batches shrink), averaged over its layers; nothing for a model without batch statistics."""
    from normplug.tools import tid
    from normplug.tools.common import load_model
    from .commands import use_gpu
    model, task, _ = load_model(str(checkpoint), str(recipe.data_path))
    if not model.batch_stat_norms():
        return {}
    split = str(recipe.train_value("valid-subset") or "valid").split(",")[0]
    max_tokens = recipe.train_value("max-tokens") or 4096
    layers = tid.measure(model, task, split, max_tokens, "cuda" if use_gpu(gpu) else "cpu")
    mean, var = tid.mean_over_layers(layers)
    log(f"{recipe.name}: TID on {split} (max tokens {max_tokens}), mean over {len(layers)} layers: mean "
        f"{'n/a' if mean is None else f'{mean:.4f}'}, variance {var:.4f}")
    return {"tid_mean": mean, "tid_var": var, "tid_split": split, "tid_max_tokens": max_tokens}


def parse_eval_lm(text: str) -> Tuple[int, float]:
    """(tokens scored, mean loss in bits a token) from fairseq-eval-lm's log."""
    tokens = re.findall(r"Evaluated ([\d,]+) tokens", text)
    bits = re.findall(r"Loss \(base 2\): (\S+), Perplexity: ", text)
    if len(tokens) != 1 or len(bits) != 1:
        raise RuntimeError("fairseq-eval-lm's log has no single 'Evaluated N tokens' and 'Loss (base 2)' line")
    return int(tokens[0].replace(",", "")), float(bits[0])


def score_language_model(recipe: Recipe, checkpoint: Path, ckdir: Path, gpu=None, log=print):
    """Test perplexity = 2 ** (fairseq-eval-lm's mean loss in bits), on non-overlapping windows of the
    training length (the published figure) and fairseq's sliding window, each scoring every token of the
    split (check_data saw it): fairseq-eval-lm skips windows longer than the model's positions."""
    from fairseq.data import data_utils

    from .compare import window_log_probs
    from .runs import scores_path
    ev, length = recipe.evaluate, recipe.train_value("tokens-per-sample")
    dataset = data_utils.load_indexed_dataset(str(recipe.data_path / ev["gen_subset"]), None)
    expected = int(dataset.sizes.sum())  # end-of-line symbols included
    scores = {"tokens": expected}
    for prefix, context in (("", 0), ("sliding_window_", ev["context_window"])):
        argv = eval_lm_argv(recipe, checkpoint, context, gpu=gpu)
        log_path = scores_path(recipe, ckdir, "eval-lm-sliding" if context else "eval-lm", ".log")
        log("$ " + shlex.join(argv))
        text = run_checked(argv, "fairseq-eval-lm", log_path)
        tokens, bits = parse_eval_lm(text)
        if tokens != expected:
            raise RuntimeError(f"fairseq-eval-lm scored {tokens:,} of the {expected:,} tokens of the "
                               f"{ev['gen_subset']} split (it skips windows longer than the model's "
                               f"positions); see {log_path}")
        scores.update({prefix + "perplexity": round(2 ** bits, 2), prefix + "loss_bits": bits})
        if not context:  # the paired tests of `compare` take each window's log-probability
            path = scores_path(recipe, ckdir, "log-probs", ".txt")
            write_atomic(path, "".join(f"{v!r}\n" for v in window_log_probs(text)))
            scores["window_log_probs"] = path.name
    log(f"{recipe.name}: perplexity {scores['perplexity']:.2f} (non-overlapping windows of {length} tokens; "
        f"{expected:,} tokens); sliding window with {ev['context_window']} tokens of context: "
        f"{scores['sliding_window_perplexity']:.2f}")
    return {**scores, "sliding_window_context": ev["context_window"], "tokens_per_sample": length}
