"""EAGLE-3 checkpoint formats on disk: read either into a `DraftContract`, write either out of one.

- `schema`: the on-disk vocabulary (file names, format names, keys) and `detect_format`.
- `values`: the rule each config value must meet (type, range, finiteness) before it is used.
- `parse`: one config file of either format read into contract fields, with provenance (`load_json`).
- `compare`: a folder's config files, which one defines the contract, and their graded disagreements.
- `validate`: THE validator of tensors and the vocab map against a contract (`tensor_problems`,
  `vocab_map_problems`); every finding carries a code from eyas.codes.
- `read`: `read_checkpoint` and the `Checkpoint` it returns.
- `emit`: a contract as a speculators or eagle config dict (`speculators_config`, `eagle_config`).
- `write`: `write_checkpoint` and `convert_checkpoint`, atomic and verified by reading back.

Weights keep their names except the one EAGLE rename (`midlayer.` = `layers.0.`, in eyas.weights).
Nothing here imports or runs code from a checkpoint (`auto_map` is ignored).
"""

from eyas.contract import IDS, target_facts
from eyas.formats.emit import eagle_config, sglang_layer_ids, speculators_config
from eyas.formats.parse import load_json
from eyas.formats.read import Checkpoint, read_checkpoint
from eyas.formats.schema import CONFIG_NAMES, EAGLE_ARCH, FORMATS, LAYER_CONVENTIONS, NORM_FLAGS, detect_format
from eyas.formats.validate import tensor_problems, vocab_map_problems
from eyas.formats.write import convert_checkpoint, write_checkpoint

__all__ = [
    "CONFIG_NAMES",
    "EAGLE_ARCH",
    "FORMATS",
    "IDS",  # lives in eyas.contract (checks name it in their findings)
    "LAYER_CONVENTIONS",
    "NORM_FLAGS",
    "Checkpoint",
    "convert_checkpoint",
    "detect_format",
    "eagle_config",
    "load_json",
    "read_checkpoint",
    "sglang_layer_ids",
    "speculators_config",
    "target_facts",  # lives in eyas.contract; re-exported while eyas.doctor imports it from here
    "tensor_problems",
    "vocab_map_problems",
    "write_checkpoint",
]
