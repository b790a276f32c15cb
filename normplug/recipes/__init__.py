"""The recipe driver: a config (configs/*.yaml) -> fairseq-train, the checkpoint it evaluates,
its scores and the reproduction table (``normplug-recipe``, :mod:`normplug.recipes.cli`)."""
from .commands import (PLUGIN_DIR, check_flags, child_env, device_flags, eval_lm_argv, fairseq_exe, generate_argv,
                       merged_flags, recipe_changes, run_logged, split_extra, train_argv, write_atomic)
from .config import LM_EVALUATE_KEYS, TRANSLATION_EVALUATE_KEYS, ConfigError, Recipe, load_config
from .runs import RUN_RECORD, check_data, choose_checkpoint, data_identity, evaluate, read_run_record, train
from .scoring import (compound_split, detokenize, official_references, parse_eval_lm, parse_generate,
                      sacrebleu_score, score, tokenized_bleu)
from .table import RESULT_COLUMNS, fmt, reproduce, write_csv, write_results
from .cli import main
