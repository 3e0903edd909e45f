"""Running llama.cpp's converter on eyas drafts, and reading what it wrote (the GGUF's EAGLE-3 keys).

What llama.cpp does with a draft, with its sources, is `eyas.check.llamacpp` (a consumer view like
vLLM's); this module runs the converter from the engine install (`scripts/install-engines.sh`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from eyas.engines.launch import engine_python, llamacpp_dir
from eyas.errors import EyasError


def convert_to_gguf(jobs: list[tuple[Path, Path]], target_dir: Path, *, timeout: float = 600) -> None:
    """Run llama.cpp's converter (pure Python, its bundled gguf-py) on each (draft folder, out .gguf),
    in ONE interpreter of the engine venv (it has what the converter imports). EyasError on failure,
    with the converter's last lines."""
    src = llamacpp_dir()
    argv = [["convert_hf_to_gguf.py", str(d), "--target-model-dir", str(target_dir), "--outfile", str(out),
             "--outtype", "f32"] for d, out in jobs]
    code = ("import json, sys\n"
            f"sys.path.insert(0, {str(src)!r})\n"
            "import convert_hf_to_gguf as c\n"
            f"for a in json.loads({json.dumps(json.dumps(argv))}):\n"
            "    sys.argv = a\n"
            "    c.main()\n")
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # the bundled gguf-py, not another
    proc = subprocess.run([str(engine_python("vllm")), "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=src, start_new_session=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-12:])
        raise EyasError(f"llama.cpp's converter failed (exit {proc.returncode}):\n{tail}",
                        "see convert_hf_to_gguf.py's message; eyas inspect shows what llama.cpp reads")


def read_gguf_draft(path: Path) -> dict[str, Any]:
    """The EAGLE-3 facts a GGUF records: architecture, target layers, target hidden size, norm flags,
    whether it has its own output (lm_head), and d2t as absolute target ids (None without). Read with
    the `gguf` package eyas depends on."""
    import gguf

    r = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in r.fields.items() if k.startswith(("general.architecture", "eagle3."))}
    d2t = next((t for t in r.tensors if t.name == "d2t"), None)
    output = any(t.name == "output.weight" for t in r.tensors)
    return {"architecture": fields.get("general.architecture"), "target_layers": fields.get("eagle3.target_layers"),
            "target_hidden_size": fields.get("eagle3.target_hidden_size"),
            "norm_before_residual": fields.get("eagle3.norm_before_residual"),
            "norm_before_fc": fields.get("eagle3.norm_before_fc"), "output": output,
            "d2t": None if d2t is None else [int(x) for x in d2t.data]}
