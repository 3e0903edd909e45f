"""The examples each verb's `--help` ends with: the grammar shown in use."""

EXAMPLES = {
    "inspect": """examples:
  eyas inspect
  eyas inspect ./EAGLE3-LLaMA3.1-Instruct-8B
  eyas inspect ./draft/config.json --target ./Llama-3.1-8B-Instruct/config.json --json
  eyas inspect ./kimi-eagle3 --layer-convention output""",
    "check": """examples:
  eyas check
  eyas check ./EAGLE3-LLaMA3.1-Instruct-8B --target ./Llama-3.1-8B-Instruct
  eyas check ./draft --target ./target/config.json --json
  eyas check ./draft/config.json
  eyas check ./draft --engine vllm   # what vLLM would wire otherwise is a problem (exit 1)""",
    "convert": """examples:
  eyas convert ./EAGLE3-LLaMA3.1-8B ./eagle3-spec --format speculators --verifier-name meta-llama/Llama-3.1-8B-Instruct
  eyas convert ./speculators-draft ./sglang-draft --format eagle
  eyas convert ./draft ./draft-both --format both --target ./Llama-3.1-8B-Instruct --force""",
    "init": """examples:
  eyas init ./smollm2-draft
  eyas init ./my-draft --target ./Llama-3.2-1B-Instruct --capture-layers 2,8,13 --format speculators""",
    "capture": """examples:
  eyas capture --prompts sharegpt --limit 2000 --out ./shards
  eyas capture --target ./my-target --prompts prompts.jsonl --out ./shards --capture-layers 2,8,13""",
    "eval": """examples:
  eyas eval --prompts mtbench --limit 10
  eyas eval ./draft --data ./shards --json
  eyas eval --prompts mtbench --limit 10 --temperature 0.8
  eyas eval ./new-draft --prompts mtbench --against default
  eyas eval ./draft --target ./my-target --prompts prompts.jsonl --plot acceptance.png""",
    "train": """examples:
  eyas train --data ./shards --out ./run --draft-vocab 8192 --epochs 3
  eyas train --data ./shards --out ./run --resume
  torchrun --nproc_per_node=2 -m eyas train --data ./shards --out ./run""",
    "generate": """examples:
  eyas generate --prompt "Explain speculative decoding in two sentences."
  eyas generate ./draft --prompt "Write a haiku" --tree 6,4,24 --temperature 0.7 --seed 1
  eyas generate ./draft --prompt "Hi" --draft-tokens 4 --dtype float32 --json""",
    "bench": """examples:
  eyas bench --limit 8
  eyas bench ./draft --prompts copy,mtbench --max-new-tokens 256 --json
  eyas bench ./draft --sweep --limit 8 --plot speedup.png""",
    "doctor": """examples:
  eyas doctor
  eyas doctor ./draft --target ./my-target --prompts prompts.jsonl --json
  eyas doctor ./draft --features ./vllm-dump.safetensors""",
    "serve-check": """examples:
  eyas serve-check
  eyas serve-check ./draft --target ./my-target --limit 10 --max-new-tokens 64 --json
  eyas serve-check --temperature 0.8
  eyas serve-check ./draft --dump vllm-dump.safetensors && eyas doctor ./draft --features vllm-dump.safetensors""",
}
