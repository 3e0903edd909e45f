"""Training data for a draft: prompts in, target features out, as safetensors shards.

The pipeline (`eyas capture`, then `eyas train` / `eyas eval --data`):

    read_prompts(file or "sharegpt" / "mtbench")   only the first human turn of each conversation
      -> capture(target, prompts, capture_layers, out_dir)
           the target regenerates every response, then ONE forward over prompt+response
           captures the features; shards of samples + manifest.json
      -> open_shards(out_dir)                      checks the manifest, skips broken shards
      -> eyas.shift.shift_for_draft(sample)        the ONE label shift (g_t pairs with x_{t+1})

Submodules:
    prompts    prompt readers: prompt files, the packaged sets, the streaming (truncation-tolerant)
               JSON array reader
    sources    more prompt sources (`sharegpt-clean`, `sharegpt-turns`: later turns in context),
               deduplicated against every evaluation set; registered with read_prompts on import
    self_written  prompts the target writes itself (a JSONL file; `python -m eyas.data.self_written`)
    answers    the target's answers to a batch of prompts (the lean forward, else `generate`)
    capturing  `capture`: regenerate the answers, one forward, store the features
    shards     the on-disk format: manifest, shards written atomically, `open_shards` /
               `CapturedData` reading them back checked
    textfile   untrusted text (prompt files): UTF-8 / UTF-16 decoded, binary and endless lines refused
    values     numbers checked where they enter: NaN/Inf, ids outside the vocabulary, lengths
               (`check_tensors`: shards, engine dumps, foreign caches)
"""

from eyas.data.answers import answer, eos_ids, pad_id
from eyas.data.capturing import capture, encode_prompts, prompts_fit
from eyas.data.prompts import (
    DEFAULT_EVAL_PROMPTS,
    DEFAULT_TRAIN_PROMPTS,
    Prompt,
    copy_heavy_file,
    json_records,
    packaged_file,
    read_prompts,
    short_of_limit,
)
from eyas.data.shards import FORMAT, FORMAT_VERSION, MANIFEST, CapturedData, open_shards
from eyas.data.sources import EvalIndex, eval_index  # importing it registers its prompt sources

__all__ = [
    "DEFAULT_EVAL_PROMPTS",
    "DEFAULT_TRAIN_PROMPTS",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "CapturedData",
    "EvalIndex",
    "Prompt",
    "answer",
    "capture",
    "copy_heavy_file",
    "encode_prompts",
    "eos_ids",
    "eval_index",
    "json_records",
    "open_shards",
    "packaged_file",
    "pad_id",
    "prompts_fit",
    "read_prompts",
    "short_of_limit",
]
