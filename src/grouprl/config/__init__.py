"""Config machinery over plain dataclasses: YAML in and out, command-line overrides, ``--help``
and the docs' config reference (docs/configuration.md), all driven by one docstring per field.

Each field is documented once, by a string literal right under it (the CleanRL/tyro style)::

    @dataclass
    class Optim:
        lr: float = 1e-6
        \"\"\"AdamW learning rate.\"\"\"

Python drops those literals at run time, so :func:`field_docs` reads them back from the source
with ``ast``. A field whose type is itself a dataclass is a *section*; its fields are addressed
with dots (``sampling.temperature``) in YAML paths, on the command line and in error messages.

The resolution order is: dataclass defaults, then the YAML file, then command-line overrides
(:func:`load_config`). Every user mistake raises :class:`ConfigError`, whose message is one
paragraph naming the key at fault and, for an unknown key, the closest valid ones.

Modules: :mod:`~grouprl.config.fields` (types, field docs, key suggestions),
:mod:`~grouprl.config.convert` (values, dicts and YAML), :mod:`~grouprl.config.options` (command
line, ``--help``, resolution), :mod:`~grouprl.config.reference` (the docs' reference page),
:mod:`~grouprl.config.train_config` (the run-level configs) and :mod:`~grouprl.config.run_checks` (:func:`check`).
A config read from a mapping (YAML, the command line) is checked as it is read; one built in Python is checked by
the Trainer that takes it.
"""

from grouprl.config.convert import from_dict, read_yaml_mapping, save_yaml, to_dict
from grouprl.config.fields import field_docs, type_name
from grouprl.config.options import (
    FieldInfo,
    add_dataclass_arguments,
    apply_overrides,
    describe_fields,
    format_value,
    load_config,
    load_yaml,
    parse_overrides,
)
from grouprl.config.reference import README_BEGIN, README_END, check_readme, config_reference_markdown, sync_readme
from grouprl.config.run_checks import check
from grouprl.config.train_config import (
    DEFAULT_TASK_EVAL_SIZE,
    DEFAULT_TASK_TRAIN_SIZE,
    TINY_MODEL,
    RewardModelConfig,
    TrainConfig,
    is_import_path,
)
from grouprl.errors import ConfigError

__all__ = [
    "DEFAULT_TASK_EVAL_SIZE", "DEFAULT_TASK_TRAIN_SIZE", "README_BEGIN", "README_END", "TINY_MODEL",
    "ConfigError", "FieldInfo", "RewardModelConfig", "TrainConfig",
    "add_dataclass_arguments", "apply_overrides", "check", "check_readme", "config_reference_markdown",
    "describe_fields", "field_docs", "format_value", "from_dict", "is_import_path", "load_config", "load_yaml",
    "parse_overrides",
    "read_yaml_mapping", "save_yaml", "sync_readme", "to_dict", "type_name",
]
