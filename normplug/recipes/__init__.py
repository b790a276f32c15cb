"""The recipe driver: a config (configs/*.yaml) -> fairseq-train, the checkpoint it evaluates,
its scores and the reproduction table (``normplug-recipe``, :mod:`normplug.recipes.cli`)."""
from .commands import (PLUGIN_DIR, check_flags, child_env, eval_lm_argv, fairseq_exe, generate_argv,
                       merged_flags, run_checked, run_logged, train_argv, write_atomic)
from .config import TRANSLATION_EVALUATE_KEYS, ConfigError, Recipe, load_config
from .runs import RUN_RECORD, check_data, data_identity, evaluate, prior_run, train
from .scoring import (compound_split, detokenize, official_references, parse_eval_lm, parse_generate,
                      sacrebleu_score, score, tokenized_bleu)
from .table import RESULT_COLUMNS, fmt, reproduce, write_csv
from .cli import main
