"""The recipe driver: a recipe (a config in configs/*.yaml) -> fairseq-train, the checkpoint it evaluates,
its scores and the reproduction table (``normplug-recipe``, :mod:`normplug.recipes.cli`)."""
from .commands import (PLUGIN_DIR, check_flags, check_visible_gpus, command_line, eval_lm_argv, fairseq_exe,
                       generate_argv, merged_flags, python_dict, run_logged, train_argv, write_atomic)
from .config import TRANSLATION_EVALUATE_KEYS, ConfigError, Recipe, load_config
from .launch import Launch
from .passthrough import with_evaluation_arguments, with_training_arguments
from .records import RUN_RECORD, check_data, data_identity, prior_run, row_status
from .runs import dry_run_note, evaluate, evaluate_commands, train, train_commands
from .scoring import (compound_split, detokenize, official_references, parse_eval_lm, parse_generate,
                      score, tokenized_bleu)
from .table import RESULT_COLUMNS, fmt, reproduce, run_folder, write_csv
from .cli import main
