"""Merge a LoRA adapter into its base model and save a full model folder (safetensors):

    python sft/utils/merge_lora.py --base_model_name bundled:SmolLM2-135M-Instruct \
        --lora_model_path checkpoints/sft/sokoban --output_path models/sokoban-sft

The result loads with `AutoModelForCausalLM.from_pretrained` and is a `model_path` for `train.sh` and
`python -m ragen.eval`. The base model may be anything `model_path` takes (the bundled model, a local folder,
a hub id in the local cache). PEFT does the merge: W + (alpha / rank) * B @ A in every adapted layer.
"""

import argparse
import sys
from pathlib import Path

from verl.utils.checkpoint import written_whole
from verl.utils.model import DTYPES, load_causal_lm, load_tokenizer, resolve_model_path


def merge(base_model_name: str, lora_model_path: str, output_path: str, dtype: str = "float32") -> Path:
    from peft import PeftModel

    adapter = Path(lora_model_path)
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter} holds no LoRA adapter (adapter_config.json); give the <save_path> of "
                                "sft/finetune_lora.sh")
    base_path = resolve_model_path(base_model_name)
    model = PeftModel.from_pretrained(load_causal_lm(base_path, "float32"), str(adapter)).merge_and_unload()
    output = Path(output_path)
    with written_whole(output) as staging:  # never a half-written model at output_path
        model.to(DTYPES[dtype]).save_pretrained(staging, safe_serialization=True)
        load_tokenizer(base_path).save_pretrained(staging)
    return output


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base_model_name", required=True, help="the model the adapter was trained on")
    parser.add_argument("--lora_model_path", required=True, help="the adapter folder (finetune_lora.sh's <save_path>)")
    parser.add_argument("--output_path", required=True, help="folder for the merged model")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights' dtype on disk")
    args = parser.parse_args(argv)
    try:
        output = merge(args.base_model_name, args.lora_model_path, args.output_path, args.dtype)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"merge_lora: {e}")
    print(f"merged model saved to {output}")


if __name__ == "__main__":
    main()
