"""The recipe driver: a recipe (a config in configs/*.yaml) -> fairseq-train, the checkpoint it evaluates,
its scores and the reproduction table (``normplug-recipe``, :mod:`normplug.recipes.cli`)."""
from .commands import (PLUGIN_DIR, check_flags, check_visible_gpus, command_line, eval_lm_argv, fairseq_exe,
                       generate_argv, gpu_flags, merged_flags, python_dict, run_logged, train_argv, write_atomic)
from .config import TRANSLATION_EVALUATE_KEYS, ConfigError, Recipe, load_config
from .runs import (RESULT_COLUMNS, RUN_RECORD, check_data, data_identity, dry_run_note, evaluate, evaluate_commands,
                   fmt, prior_run, reproduce, row_status, train, train_command, write_csv)
from .scoring import (compound_split, detokenize, official_references, parse_eval_lm, parse_generate,
                      score, tokenized_bleu)
from .cli import main
