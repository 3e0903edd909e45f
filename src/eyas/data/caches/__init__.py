"""Feature caches written by other EAGLE-3 trainers, read as they are, one sample at a time.

People who bring a draft already have the target's features on disk, captured by their trainer
(often by a distributed engine eyas could not run). This package reads those caches without
re-running anything, and says what it knows about how they were taken: which target layers (in
eyas's capture convention, and whether the cache records them or eyas assumes the trainer's
default), whether the last hidden state is stored and if it is normed, and whether the answers are
the target's own.

    cache = open_cache(path, num_layers=target.num_layers)   # format detected, or format="specforge"
    cache.info.layers_note   # "stored: output of layers 1, 29, 57 = capture [2, 30, 58] (assumed: ...)"
    for sample in cache:     # eyas's UNSHIFTED sample dict: feed it to eyas.shift.shift_for_draft
        ...

Formats (CACHE_FORMATS, the names `--data-format` takes), one module each, citing the code read:
    eyas                native: `eyas capture` shards (eyas.data.shards)
    eyas-dump           native: one engine dump (eyas.data.dumps.read_dump)
    specforge           specforge: `scripts/prepare_hidden_states.py`'s data_{idx}.ckpt[.gz]
    speculators         speculators: Arrow dataset + hidden_states/hs_{row}.safetensors (via arrow)
    speculators-legacy  speculators_legacy: data_{i}.pt + data_config.json (before 2026-03)
    modelopt            modelopt: ModelOpt's {conversation_id}.pt
Shared pieces: base (CacheInfo, FeatureCache, per-sample checks), layers (layer conventions and
notes), pickles (torch.load with weights_only=True), detect (detect_format, open_cache).
"""

from eyas.data.caches.base import NORMED, PRE_NORM, CacheInfo, FeatureCache, LongerThanContext
from eyas.data.caches.detect import CACHE_FORMATS, detect_format, open_cache

__all__ = ["CACHE_FORMATS", "NORMED", "PRE_NORM", "CacheInfo", "FeatureCache", "LongerThanContext", "detect_format",
           "open_cache"]
