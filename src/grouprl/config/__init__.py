"""Config machinery over plain dataclasses: YAML, command-line overrides, ``--help`` and docs/configuration.md,
all driven by one docstring per field; a dataclass-typed field is a section, addressed with dots (``a.b``).

Resolution: defaults < YAML file < command line (:func:`load_config`). Every user mistake raises
:class:`ConfigError`, one paragraph naming the key at fault and, for an unknown key, the closest valid ones.
"""

from grouprl.config.convert import from_dict, read_yaml_mapping, save_yaml, to_dict, yaml_text
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
from grouprl.config.reference_page import README_BEGIN, README_END, check_readme, config_reference_markdown, sync_readme
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
    "DEFAULT_TASK_EVAL_SIZE", "DEFAULT_TASK_TRAIN_SIZE", "README_BEGIN", "README_END", "TINY_MODEL", "ConfigError",
    "FieldInfo", "RewardModelConfig", "TrainConfig", "add_dataclass_arguments", "apply_overrides", "check",
    "check_readme", "config_reference_markdown", "describe_fields", "field_docs", "format_value", "from_dict",
    "is_import_path", "load_config", "load_yaml", "parse_overrides", "read_yaml_mapping", "save_yaml", "sync_readme",
    "to_dict", "type_name", "yaml_text",
]
