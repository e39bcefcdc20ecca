"""A small vision-language model made here: a causal LM given eyes, the way SmolVLM is built (Idefics3).

No pretrained vision-language model can be downloaded in this project's offline setting, so `build_vlm` makes
one from a language model we have (the bundled SmolLM2) and a vision encoder initialised at random:

- the vision tower is a SigLIP-style ViT (`Idefics3VisionConfig`) over `patch_size` pixel patches; with the
  environments' 16-pixel tiles and `patch_size=16`, one patch is one board cell;
- the connector (Idefics3's pixel shuffle, `scale_factor`², then a linear map) turns the patches into
  `(image_size / patch_size / scale_factor)²` embeddings in the language model's width; `scale_factor=1`
  keeps one image token per patch;
- the language model is copied in unchanged: three tokens are added to its tokenizer (`<image>`, which the
  processor repeats once per image embedding, and the two that frame an image), so on text alone the new
  model computes exactly what the language model did (a test checks the logits).

The folder it writes holds the model (safetensors), its processor (tokenizer, chat template, image
processor) and loads with `AutoModelForImageTextToText.from_pretrained` and `AutoProcessor.from_pretrained`.
Until its vision tower is trained it sees nothing useful: it is the starting point of an alignment stage.

    python -m verl.utils.vlm <language model> <output folder> [--image-size 96] [--patch-size 16] ...
"""

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForCausalLM, Idefics3Config, Idefics3ForConditionalGeneration, \
    Idefics3Processor
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

from verl.utils.model import load_tokenizer, resolve_model_path

IMAGE_TOKEN, FRAME_TOKEN, GLOBAL_IMAGE_TOKEN = "<image>", "<fake_token_around_image>", "<global-img>"


def build_vlm(language_model: str, output: str | Path, image_size: int = 96, patch_size: int = 16,
              scale_factor: int = 1, vision_width: int = 256, vision_layers: int = 4, vision_heads: int = 4,
              seed: int = 0) -> Path:
    """Write a vision-language model made of `language_model` (a path or `bundled:<name>`) and a new vision
    tower to `output`; return the folder. Images are resized to `image_size` pixels on their longer side and
    not split into tiles (our boards are small)."""
    if image_size % (patch_size * scale_factor):
        raise ValueError(f"image_size={image_size} must be a multiple of patch_size x scale_factor = "
                         f"{patch_size * scale_factor}")
    path = resolve_model_path(language_model)
    tokenizer = load_tokenizer(path)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN, FRAME_TOKEN, GLOBAL_IMAGE_TOKEN]},
                                 replace_extra_special_tokens=False)
    text_config = AutoConfig.from_pretrained(path)
    config = Idefics3Config(
        text_config=text_config.to_dict(), scale_factor=scale_factor,
        vision_config={"hidden_size": vision_width, "intermediate_size": 4 * vision_width,
                       "num_hidden_layers": vision_layers, "num_attention_heads": vision_heads,
                       "image_size": image_size, "patch_size": patch_size},
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        tie_word_embeddings=text_config.tie_word_embeddings)
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config)
    language = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.model.text_model.load_state_dict(language.model.state_dict())
    if not config.tie_word_embeddings:
        model.lm_head.load_state_dict(language.lm_head.state_dict())
    # the new tokens get the mean of the old embeddings: text without them computes exactly as before
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():
        embeddings = model.get_input_embeddings().weight
        embeddings[text_config.vocab_size:] = embeddings[:text_config.vocab_size].mean(dim=0)
    image_processor = Idefics3ImageProcessorPil(
        do_resize=True, size={"longest_edge": image_size}, max_image_size={"longest_edge": image_size},
        do_image_splitting=False)
    tokens_per_image = (image_size // (patch_size * scale_factor)) ** 2
    processor = Idefics3Processor(image_processor, tokenizer, image_seq_len=tokens_per_image,
                                  chat_template=tokenizer.chat_template)
    output = Path(output)
    model.save_pretrained(output)
    processor.save_pretrained(output)
    return output


def image_prompt_text(processor, picture: np.ndarray) -> str:
    """What `processor` writes in a prompt for one `picture` (the tokens its model fills with the picture's
    embeddings, and those around them), as text that the tokenizer encodes back to exactly those ids."""
    ids = processor(text=[IMAGE_TOKEN], images=[[Image.fromarray(picture)]], add_special_tokens=False)["input_ids"][0]
    ids = list(map(int, ids))
    text = processor.tokenizer.decode(ids)
    if processor.tokenizer.encode(text, add_special_tokens=False) != ids:
        raise ValueError(f"{type(processor).__name__}'s image tokens do not survive decoding and encoding again: "
                         "their text cannot stand in a prompt built as text")
    return text


def pixel_inputs(processor, pictures: list[list[np.ndarray]]) -> dict[str, torch.Tensor]:
    """The model's pixel inputs for each row's pictures ((H, W, 3) uint8, in the order of the row's image tokens):
    `pixel_values` (rows, most pictures, 3, H', W') and its mask; a row with fewer gets blank padding pictures,
    which the model skips."""
    return dict(processor.image_processor([[Image.fromarray(p) for p in row] for row in pictures], return_tensors="pt"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("language_model", help="a causal LM folder or bundled:SmolLM2-135M-Instruct")
    parser.add_argument("output", help="the folder to write")
    parser.add_argument("--image-size", type=int, default=96, help="pixels on an image's longer side")
    parser.add_argument("--patch-size", type=int, default=16, help="pixels on a patch's side")
    parser.add_argument("--scale-factor", type=int, default=1, help="pixel shuffle: scale² patches per token")
    parser.add_argument("--vision-width", type=int, default=256)
    parser.add_argument("--vision-layers", type=int, default=4)
    parser.add_argument("--vision-heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = build_vlm(args.language_model, args.output, args.image_size, args.patch_size, args.scale_factor,
                       args.vision_width, args.vision_layers, args.vision_heads, args.seed)
    print(f"vision-language model written to {folder}")


if __name__ == "__main__":
    main()
