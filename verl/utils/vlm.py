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

The rest of the module carries pictures through rollout and training for any vision-language model of two kinds:
image tokens in a row with a picture axis in the pixel inputs (Idefics3/SmolVLM, as the one made here), and the
Qwen2-VL family, whose pictures' patches come in one sequence and whose picture tokens sit on a grid of positions
(M-RoPE): `image_prompt_text` (a picture's tokens in a prompt), `pixel_inputs` (a batch's pictures, one row per
prompt), `model_pixel_inputs` (the model's arguments for them), `mrope_position_ids` and `MRopeProcessor`.
"""

import argparse
import functools
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import AutoConfig

from verl.utils.model import load_tokenizer, resolve_model_path

IMAGE_TOKEN, FRAME_TOKEN, GLOBAL_IMAGE_TOKEN = "<image>", "<fake_token_around_image>", "<global-img>"


def build_vlm(language_model: str, output: str | Path, image_size: int = 96, patch_size: int = 16,
              scale_factor: int = 1, vision_width: int = 256, vision_layers: int = 4, vision_heads: int = 4,
              seed: int = 0) -> Path:
    """Write a vision-language model made of `language_model` (a path or `bundled:<name>`) and a new vision
    tower to `output`; return the folder. Images are resized to `image_size` pixels on their longer side and
    not split into tiles (our boards are small)."""
    # imported here, not at the top: every training process imports this module, few build a model (~0.2 s each)
    from transformers import AutoModelForCausalLM, Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

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
    embeddings, and those around them), as text that the tokenizer encodes back to exactly those ids. It depends
    on the picture's size alone, so it is worked out once per processor and size."""
    return _image_prompt_text(processor, picture.shape)


@functools.cache
def _image_prompt_text(processor, shape: tuple[int, ...]) -> str:
    ids = processor(text=[processor.image_token], images=[[Image.fromarray(np.zeros(shape, dtype=np.uint8))]],
                    add_special_tokens=False)["input_ids"][0]
    ids = list(map(int, ids))
    text = processor.tokenizer.decode(ids)
    if processor.tokenizer.encode(text, add_special_tokens=False) != ids:
        raise ValueError(f"{type(processor).__name__}'s image tokens do not survive decoding and encoding again: "
                         "their text cannot stand in a prompt built as text")
    return text


def pixel_inputs(processor, pictures: list[list[np.ndarray]]) -> dict[str, torch.Tensor]:
    """The pixel inputs of each row's pictures ((H, W, 3) uint8, in the order of the row's image tokens), one
    row per prompt, as a batch holds them (`model_pixel_inputs` turns them into the model's arguments):
    - Idefics3/SmolVLM: `pixel_values` (rows, most pictures, 3, H', W') and its mask; a row with fewer pictures
      gets blank ones, which the model skips;
    - the Qwen2-VL family: `pixel_values` (rows, most patches, patch values), each row's patches zero-padded,
      and `image_grid_thw` (rows, most pictures, 3), each picture's patch grid, padded with zeros."""
    out = dict(processor.image_processor([[Image.fromarray(p) for p in row] for row in pictures],
                                         return_tensors="pt"))
    if "image_grid_thw" not in out:  # one row per prompt already
        return out
    grids = list(out["image_grid_thw"].split([len(row) for row in pictures]))
    patches = out["pixel_values"].split([int(g.prod(dim=-1).sum()) for g in grids])  # all pictures' patches, in order
    return {"pixel_values": torch.nn.utils.rnn.pad_sequence(list(patches), batch_first=True),
            "image_grid_thw": torch.nn.utils.rnn.pad_sequence(grids, batch_first=True)}


PIXEL_KEYS = ("pixel_values", "pixel_attention_mask", "image_grid_thw")  # what `pixel_inputs` puts in a batch


def row_pictures(pixels: dict[str, torch.Tensor], row: int, count: int) -> dict[str, torch.Tensor]:
    """The pixel inputs of the first `count` pictures of one row of a batch's (`pixel_inputs`), without the row
    dimension: what a prompt holding only those pictures takes."""
    if "image_grid_thw" not in pixels:  # a picture per entry
        return {key: value[row, :count] for key, value in pixels.items()}
    grids = pixels["image_grid_thw"][row, :count]
    return {"pixel_values": pixels["pixel_values"][row, :int(grids.prod(dim=-1).sum())], "image_grid_thw": grids}


def stack_pictures(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """`row_pictures` of several prompts as a batch holds them, each key zero-padded to its longest row (blank
    pictures and zero grids, which the model skips, as `pixel_inputs` pads)."""
    return {key: torch.nn.utils.rnn.pad_sequence([row[key] for row in rows], batch_first=True) for key in rows[0]}


def uses_mrope(config) -> bool:
    """Whether the model places picture tokens on a grid of positions (M-RoPE: the Qwen2-VL family)."""
    return getattr(config, "vision_start_token_id", None) is not None


def model_pixel_inputs(config, pixels: dict[str, torch.Tensor], input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The model's arguments for a batch's pixel inputs (`pixel_inputs`, rows as in `input_ids`): as they are,
    or for the Qwen2-VL family every picture's patches in one sequence, the grids of the real pictures, and
    `mm_token_type_ids` (1 on image tokens), from which `generate` places the pictures' tokens."""
    if "image_grid_thw" not in pixels:
        return dict(pixels)
    grids = pixels["image_grid_thw"]  # (B, M, 3), padded with zero grids
    counts = grids.prod(dim=-1).sum(dim=-1).tolist()  # patches per row
    return {"pixel_values": torch.cat([row[:n] for row, n in zip(pixels["pixel_values"], counts)]),
            "image_grid_thw": grids[grids.prod(dim=-1) > 0],
            "mm_token_type_ids": (input_ids == config.image_token_id).int()}


def mrope_position_ids(config, input_ids: torch.Tensor, position_ids: torch.Tensor, image_grid_thw: torch.Tensor,
                       hidden_from: torch.Tensor | None = None) -> torch.Tensor:
    """(3, B, T) M-RoPE positions (temporal, height, width) of right-padded rows whose text positions are
    `position_ids` (B, T), as the rollout engine placed them (with a context window: where each token stood in
    its prompts, `hidden_from` saying which tokens each prompt held; ragen/context_manager.window_layout).

    The Qwen2-VL rule, the one `get_rope_index` applies to a whole prompt: a text token's three positions are
    equal and count one per token, except that a picture of h x w tokens (after the spatial merge) counts
    max(h, w) instead of h x w; the picture's tokens sit at (start, start + row, start + column), start being
    where the picture begins. So each token's text position drops by h x w - max(h, w) for every picture
    before it in its own prompt, which a context window may have hidden."""
    merge = config.vision_config.spatial_merge_size
    rows, width = input_ids.shape
    steps = torch.arange(width)
    out = position_ids[None].repeat(3, 1, 1)
    for row in range(rows):
        grids = [grid for grid in image_grid_thw[row].tolist() if grid[0] * grid[1] * grid[2] > 0]
        image = (input_ids[row] == config.image_token_id).long()
        starts = torch.nonzero(torch.diff(image, prepend=image.new_zeros(1)) == 1).flatten().tolist()
        if len(starts) != len(grids):
            raise ValueError(f"row {row} holds {len(starts)} picture(s) of image tokens and {len(grids)} picture "
                             "grid(s): pictures and their tokens must come in pairs")
        shift, blocks = torch.zeros(width, dtype=torch.long), []
        for start, (t, h, w) in zip(starts, grids):
            h, w = h // merge, w // merge
            end = start + t * h * w
            until = width if hidden_from is None else int(hidden_from[row, start])  # the prompts that hold it
            shift += ((steps >= end) & (steps < until)) * (t * h * w - max(h, w))
            blocks.append((start, end, t, h, w))
        text = position_ids[row] - shift
        out[:, row] = text
        for start, end, t, h, w in blocks:
            grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
            out[:, row, start:end] = text[start] + grid.reshape(3, -1)
    return out


class MRopeProcessor:
    """What a Qwen2-VL-family model needs to take pictures: its tokenizer and image processor. (Its own
    processor also holds a video processor, which needs torchvision; pictures never use it.) Called like a
    processor on text where `image_token` stands for each picture, it writes the picture's tokens as that
    family's chat template frames them: `<|vision_start|>`, one `<|image_pad|>` per merged patch,
    `<|vision_end|>`."""

    def __init__(self, path: str):
        from transformers import AutoImageProcessor

        config = AutoConfig.from_pretrained(path)
        self.tokenizer = load_tokenizer(path)
        self.image_processor = AutoImageProcessor.from_pretrained(path)
        self.start, self.pad, self.end = self.tokenizer.convert_ids_to_tokens(
            [config.vision_start_token_id, config.image_token_id, config.vision_end_token_id])
        self.image_token = self.start + self.pad + self.end

    def save_pretrained(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)

    def __call__(self, text: list[str], images: list[list[Image.Image]], add_special_tokens: bool = True) -> dict:
        input_ids = []
        for line, pictures in zip(text, images, strict=True):
            pieces = line.split(self.image_token)
            if len(pieces) != len(pictures) + 1:
                raise ValueError(f"{len(pieces) - 1} picture placeholder(s) and {len(pictures)} picture(s)")
            merged = self.image_processor.merge_size ** 2
            grids = self.image_processor(pictures, return_tensors="pt")["image_grid_thw"] if pictures else []
            line = pieces[0] + "".join(self.start + self.pad * (int(grid.prod()) // merged) + self.end + piece
                                       for grid, piece in zip(grids, pieces[1:]))
            input_ids.append(self.tokenizer.encode(line, add_special_tokens=add_special_tokens))
        return {"input_ids": input_ids}


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
