"""A static HTML browser over rollout records: one page per trajectory, an index with filters and search.

Layout (RAGEN's, inside the run folder): `<log_image_dir>/step_<N>/trajectory_data_<i>.html`, `i` being the
trajectory's `env_id` (its line in `rollouts/<split>/step_<N>.jsonl`), next to `trajectories.json`, the
step's summaries; a validation's pages go to `val_step_<N>/` beside them (validation plays the same start
states every time, so `val_step_0/trajectory_data_3.html` and `val_step_20/trajectory_data_3.html` show one
level before and after training); `<log_image_dir>/index.html` lists the pages of both (`log_image_dir`
is `<run folder>/pages` by default).
Everything is inline: PNG pictures as data URIs, CSS, a little vanilla JS on the index only, and a
Content-Security-Policy that forbids any other source, so the pages open offline, from disk or under
`python -m http.server`.

Pictures: the record keeps each state as the env's text render; a grid env's `rgb_array` picture is
`grid_to_rgb` over that same symbol grid, so `state_picture` redraws it exactly from the text with the
env's tiles (`GRID_TILES`). Envs without a picture (bandit, countdown) show the text alone. A state shown to
the model as pictures (`image_observation`) has them in its record (`images`, `final_images`: PNG data URIs),
and its page shows those, as the model saw them. Every piece of
model or env text is escaped, in elements, attributes and the JSON the index embeds. A non-finite number
(a NaN reward) is null in that JSON, which JSON.parse would otherwise reject, and "n/a" on the pages.

Masks: a training record holds the text of every token of its trajectory (`token_pieces`, which the agent
loop decodes with `ragen.context_manager.token_pieces`) and what the update trained on (`trained_tokens`, from the trainer's
`with_advantages`); its page ends with every token, prompt and states included, underlined where the update
trained on it (`loss_mask`) on a background coloured by its advantage, so that a mask on the wrong tokens
shows at a glance.

Build pages for a finished run: `python -m ragen.trajectory_browser <run dir>/rollouts/train <out dir>`.
"""

import argparse
import base64
import html
import itertools
import json
import math
import re
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ragen.config import CustomEnvConfig
from ragen.envs import frozen_lake, make_env
from ragen.envs.utils import PNG_PREFIX, grid_to_rgb, png_uri
from verl.utils.tracking import read_jsonl, to_json

# env_type -> its picture tiles, from the env's `env_config` dict; envs drawn as a grid of symbols only
GRID_TILES: dict[str, Callable[[dict], dict[str, np.ndarray]]] = {
    "sokoban": lambda env_config: make_env("sokoban", env_config).tiles,  # depend on the configured symbols
    "frozen_lake": lambda env_config: frozen_lake.TILES,
    "gym_sokoban": lambda env_config: make_env("sokoban").tiles,  # the reference's text uses RAGEN's default symbols
}
IMAGE_SCALE = 2  # pictures are shown at this multiple of their TILE-pixel size
PAGE_NAME = "trajectory_data_{}.html"
STEP_DIRS = {"train": "step_{}", "val": "val_step_{}"}  # split -> its steps' folder names
SPLIT_NAMES = {"train": "train", "val": "validation"}  # as the pages show them
MANIFEST = "trajectories.json"
# No source but the page itself: a stray URL in model text can never load anything.
PNG_URI = re.compile(re.escape(PNG_PREFIX) + r"iVBORw0KGgo[A-Za-z0-9+/]+=*")  # a PNG (its signature), nothing else
PAGE_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
INDEX_CSP = PAGE_CSP + "; script-src 'unsafe-inline'"
_REPLY_TAG = re.compile(r"(</?think>|</?answer>)")
# A trained token's background (ColorBrewer RdBu's ends): blue for a positive advantage, red for a negative one
ADVANTAGE_RGB = {True: (33, 102, 172), False: (178, 24, 43)}  # keyed by advantage >= 0

esc = html.escape  # quote=True: safe inside attribute values too


# ---- pictures ------------------------------------------------------------------------------------------
def state_picture(text: str, tiles: dict[str, np.ndarray]) -> np.ndarray | None:
    """The env's `rgb_array` picture redrawn from its text state; None when the text is not a rectangle
    of the tiles' symbols (a truncated or foreign state, or coordinates alone, is shown as text only). The
    coordinate lines above a `Grid:` line (`observation_format: grid_coord`) are skipped, and cells may be
    separated by spaces (`cell_separator`): the symbols themselves are never whitespace."""
    grid = text.split("Grid:\n", 1)[1] if "Grid:\n" in text else text
    rows = [row.replace(" ", "") for row in grid.strip("\n").split("\n")]
    if not rows[0] or len({len(row) for row in rows}) != 1 or not set("".join(rows)) <= tiles.keys():
        return None
    return grid_to_rgb(np.array([list(row) for row in rows]), tiles)


def tiles_by_tag(custom_envs: dict[str, CustomEnvConfig]) -> dict[str, dict[str, np.ndarray]]:
    """Picture tiles of every env tag that has pictures."""
    return {tag: GRID_TILES[spec.env_type](dict(spec.env_config))
            for tag, spec in custom_envs.items() if spec.env_type in GRID_TILES}


# ---- one trajectory's page -----------------------------------------------------------------------------
def pick_trajectories(records: list[dict], n: int) -> list[dict]:
    """Up to `n` records (all when n < 0), taken from the groups in turn: every group's first trajectory,
    then every group's second... A batch lists a group's trajectories together, and its first n would
    show one or two start states of one env tag; this sample shows as many start states and tags as n
    allows. Returned in batch order."""
    by_group: dict[int, list[dict]] = {}
    for record in records:
        by_group.setdefault(record["group_id"], []).append(record)
    in_turn = [r for round_ in itertools.zip_longest(*by_group.values()) for r in round_ if r is not None]
    return sorted(in_turn if n < 0 else in_turn[:n], key=lambda r: r["env_id"])


def reply_html(reply: str) -> str:
    """The reply with its <think> and <answer> parts and any text outside them marked by class."""
    parts, inside = [], "outside"
    for piece in _REPLY_TAG.split(reply):
        if _REPLY_TAG.fullmatch(piece):
            inside = "outside" if piece.startswith("</") else piece.strip("<>")
            parts.append(f'<span class="tag">{esc(piece)}</span>')
        elif piece:
            parts.append(f'<span class="{inside}">{esc(piece)}</span>')
    return "".join(parts)


def state_html(text: str, tiles: dict[str, np.ndarray] | None, caption: str, shown: list[str] | None = None) -> str:
    """A state: the pictures the model was shown (`shown`, PNG data URIs from the record, for environments with
    image observations), or else the picture redrawn from its text, then the text."""
    pictures = [uri for uri in shown or [] if PNG_URI.fullmatch(uri)]
    if not pictures:
        picture = state_picture(text, tiles) if tiles else None
        pictures = [png_uri(picture)] if picture is not None else []
    images = ""
    for uri in pictures:
        width, height = struct.unpack(">II", base64.b64decode(uri[len(PNG_PREFIX):])[16:24])  # the PNG's IHDR
        images += (f'<img src="{uri}" width="{width * IMAGE_SCALE}" height="{height * IMAGE_SCALE}" '
                   f'alt="{esc(caption)}">')
    return f'<figure class="state">{images}<pre>{esc(text)}</pre><figcaption>{esc(caption)}</figcaption></figure>'


def advantage_colour(advantage: float, scale: float) -> str:
    """A trained token's background: the advantage's sign picks the hue, its size against `scale` (the
    page's largest) the opacity, at most 0.8 so that the text stays readable."""
    red, green, blue = ADVANTAGE_RGB[advantage >= 0]
    return f"rgba({red}, {green}, {blue}, {0.8 * min(abs(advantage) / scale, 1.0):.2f})"


def tokens_html(pieces: list[str], trained: dict | None) -> str:
    """Every token of the trajectory, one span each: underlined with its advantage as background where the
    update trained on it, plain where not. `trained` is `with_advantages`' `trained_tokens`: the spans
    [start, end) of the trained tokens and their advantages; None when the filter dropped the trajectory."""
    advantage_of: dict[int, float] = {}  # token position -> its advantage
    if trained is not None:
        positions = [t for start, end in trained["spans"] for t in range(start, end)]
        advantage_of = dict(zip(positions, trained["advantages"], strict=True))
    scale = max((abs(a) for a in advantage_of.values()), default=0.0) or 1.0
    off = "not trained on" if trained is not None else "not trained on (filtered)"
    spans = []
    for t, piece in enumerate(pieces):
        if t in advantage_of:
            value = advantage_of[t]
            spans.append(f'<span class="on" style="background: {advantage_colour(value, scale)}" '
                         f'title="token {t}: trained on, advantage {_signed(value, ".3f")}">{esc(piece)}</span>')
        else:
            spans.append(f'<span class="off" title="token {t}: {off}">{esc(piece)}</span>')
    if trained is None:
        heading, legend = "Tokens: not trained on (filtered)", ""
    else:
        heading = f"Tokens: {len(advantage_of)} of {len(pieces)} trained on"
        if not trained.get("updated", True):  # records from before the flag existed were all updates
            heading += " (but the actor took no update this step: every advantage was 0, or critic warm-up)"
        swatches = "".join(f'<span class="on" style="background: {advantage_colour(a, scale)}">'
                           f'{_signed(a, ".3f")}</span>' for a in (-scale, -scale / 2, 0.0, scale / 2, scale))
        legend = (f'<p class="legend">underlined: trained on (loss_mask), its advantage as background '
                  f'{swatches}; plain: not trained on. Hover a token for its value.</p>')
    return f'<section class="turn tokens"><h2>{heading}</h2>{legend}<pre>{"".join(spans)}</pre></section>'


def turn_html(number: int, turn: dict, tiles: dict[str, np.ndarray] | None) -> str:
    chips = []
    for action, valid, effective in zip(turn["actions"], turn["action_valid"], turn["action_effective"]):
        kind, note = ("ok", "valid, effective") if valid and effective else \
            ("noop", "valid, no effect") if valid else ("bad", "invalid")
        chips.append(f'<li class="chip {kind}" title="{note}">{esc(str(action))} <small>{note}</small></li>')
    facts = [("reward", _signed(turn["reward"], ".3g"))]
    if "world_model" in turn:  # agent_proxy.world_model_reward: the written states' credits, in the reward above
        credits = turn["world_model"]
        facts.append(("world model", f'observation {credits["observation"]:.2f}, prediction '
                                     f'{credits["prediction"]:.2f}, reward {_signed(credits["reward"], ".3g")}'))
    if "advantage" in turn:  # null: the variance filter dropped this trajectory's group before the update
        advantage = turn["advantage"]
        facts.append(("advantage", "filtered out" if advantage is None else _signed(advantage, ".3f")))
    reply_format = "malformed (format penalty)" if not turn["format_ok"] else \
        "ok, invalid action (format penalty)" if not all(turn["action_valid"]) else "ok"
    facts += [("format", reply_format),
              ("done", "yes" if turn["done"] else "no")]
    facts_html = "".join(_fact(name, value) for name, value in facts)
    actions = f'<ul class="actions">{"".join(chips)}</ul>' if chips else '<p class="none">no action taken</p>'
    return (f'<section class="turn{"" if turn["format_ok"] else " malformed"}"><h2>Turn {number}</h2>'
            f'<div class="cols">{state_html(turn["state"], tiles, f"state before turn {number}", turn.get("images"))}'
            f'<div class="reply"><pre>{reply_html(turn["response"])}</pre>{actions}'
            f'<dl class="facts">{facts_html}</dl></div></div></section>')


def trajectory_page(record: dict, step: int, tiles: dict[str, np.ndarray] | None, previous: str | None,
                    following: str | None) -> str:
    """The HTML page of one trajectory; `previous`/`following` are the neighbouring pages' file names."""
    title = f"{record['tag']} · step {step} · env {record['env_id']}"
    title += " · validation" if record["split"] == "val" else ""
    nav = ['<a href="../index.html">all trajectories</a>']
    nav += [f'<a href="{esc(previous)}">&larr; previous</a>'] if previous else []
    nav += [f'<a href="{esc(following)}">next &rarr;</a>'] if following else []
    facts = [("split", record["split"]), ("group", record["group_id"]), ("seed", record["seed"]),
             ("success", "yes" if record["success"] else "no"), ("reward", _signed(record["reward"], ".3g")),
             ("turns", len(record["turns"])), ("context truncated", "yes" if record["context_truncated"] else "no")]
    turns = "".join(turn_html(i + 1, turn, tiles) for i, turn in enumerate(record["turns"]))
    final = state_html(record["final_state"], tiles, "final state", record.get("final_images"))
    # training records only: validation is not trained on, and records of older runs lack the tokens
    tokens = tokens_html(record["token_pieces"], record["trained_tokens"]) \
        if "token_pieces" in record and "trained_tokens" in record else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{PAGE_CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(title)}</title><style>{CSS}</style></head><body>'
            f'<nav>{" · ".join(nav)}</nav><header><h1>{esc(title)}</h1><dl class="facts">'
            + "".join(_fact(name, value) for name, value in facts)
            + f'</dl></header>{turns}<section class="turn"><h2>End</h2>{final}</section>{tokens}</body></html>')


def _fact(name: str, value) -> str:
    return f"<div><dt>{esc(name)}</dt><dd>{esc(str(value))}</dd></div>"


def _signed(value: float | None, spec: str) -> str:
    """A number with its sign; "n/a" for a non-finite one, which records read back from JSONL hold as None."""
    return "n/a" if value is None or not math.isfinite(value) else format(value, "+" + spec)


def summary(record: dict, step: int) -> dict:
    """What the index shows and filters on for one trajectory."""
    turns = record["turns"]
    return {"step": step, "id": record["env_id"], "split": record["split"], "tag": record["tag"],
            "group": record["group_id"], "seed": record["seed"], "success": bool(record["success"]),
            "reward": record["reward"], "turns": len(turns),
            "invalid": sum(not ok for t in turns for ok in t["action_valid"]),
            "malformed": sum(not t["format_ok"] for t in turns), "truncated": bool(record["context_truncated"]),
            "text": "\n".join(t["response"] for t in turns)}


def write_step(records: list[dict], experiment_dir: Path, step: int, n_per_batch: int,
               custom_envs: dict[str, CustomEnvConfig], split: str = "train") -> list[Path]:
    """Write the pages of `n_per_batch` of one rollout's trajectories (see `pick_trajectories`; -1: all)
    and the step's summaries under `experiment_dir/step_<step>` (a validation's: `val_step_<step>`); pages
    an earlier run of the same step left there are removed. Returns the pages' paths. Call `write_index`
    afterwards."""
    if split not in STEP_DIRS:
        raise ValueError(f"split {split!r}: rollout records are {' or '.join(map(repr, STEP_DIRS))}")
    step_dir = Path(experiment_dir) / STEP_DIRS[split].format(step)
    step_dir.mkdir(parents=True, exist_ok=True)
    for old in step_dir.glob(PAGE_NAME.format("*")):
        old.unlink()
    tiles = tiles_by_tag(custom_envs)
    picked = pick_trajectories(records, n_per_batch)
    names = [PAGE_NAME.format(int(r["env_id"])) for r in picked]
    paths = []
    for i, record in enumerate(picked):
        page = trajectory_page(record, step, tiles.get(record["tag"]), names[i - 1] if i else None,
                               names[i + 1] if i + 1 < len(names) else None)
        paths.append(_write_text(step_dir / names[i], page))
    _write_text(step_dir / MANIFEST, to_json([summary(r, step) for r in picked]))
    return paths


# ---- the index -----------------------------------------------------------------------------------------
def write_index(experiment_dir: Path) -> Path:
    """(Re)write `experiment_dir/index.html` from every `step_<N>/` and `val_step_<N>/trajectories.json`
    there, by step, a step's training trajectories before its validation's."""
    experiment_dir = Path(experiment_dir)
    manifests = [(_step_number(path.parent), order, split, path)
                 for order, (split, folder) in enumerate(STEP_DIRS.items())
                 for path in experiment_dir.glob(f"{folder.format('*')}/{MANIFEST}")]
    rows = []
    for _, _, split, manifest in sorted(manifests):
        for row in json.loads(manifest.read_text(encoding="utf-8")):
            # the link is built from numbers and the folder's split, never from text read back
            page = f"{STEP_DIRS[split].format(int(row['step']))}/{PAGE_NAME.format(int(row['id']))}"
            rows.append(row | {"split": SPLIT_NAMES[split], "page": page})
    data = to_json(rows)
    # Inside <script> only "</script" could end the element; escaping < > & keeps the JSON identical.
    data = data.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
    title = f"Trajectories · {experiment_dir.resolve().name}"
    page = (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{INDEX_CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(title)}</title><style>{CSS}</style></head><body><header><h1>{esc(title)}</h1>'
            f'<p id="count"></p></header>{INDEX_FORM}'
            f'<table id="list"><thead><tr>{INDEX_HEADER}</tr></thead><tbody></tbody></table>'
            f'<script type="application/json" id="trajectories">{data}</script>'
            f'<script>{INDEX_JS}</script></body></html>')
    return _write_text(experiment_dir / "index.html", page)


def _step_number(step_dir: Path) -> int:
    suffix = step_dir.name.removeprefix("val_").removeprefix("step_")
    return int(suffix) if suffix.isdigit() else -1


def _write_text(path: Path, text: str) -> Path:
    """Write through a staging file, so that a reader never sees half a page."""
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(text, encoding="utf-8")
    staging.replace(path)
    return path


INDEX_FORM = """<form id="filters" autocomplete="off">
<label>step <select name="step"><option value="">all</option></select></label>
<label>split <select name="split"><option value="">both</option><option value="train">train</option>
<option value="validation">validation</option></select></label>
<label>env <select name="tag"><option value="">all</option></select></label>
<label>success <select name="success"><option value="">any</option><option value="1">yes</option>
<option value="0">no</option></select></label>
<label>reward <input name="rmin" type="number" step="any" placeholder="min"> to
<input name="rmax" type="number" step="any" placeholder="max"></label>
<label>turns <input name="tmin" type="number" min="0" placeholder="min"> to
<input name="tmax" type="number" min="0" placeholder="max"></label>
<label>invalid actions <select name="invalid"><option value="">any</option><option value="1">some</option>
<option value="0">none</option></select></label>
<label>malformed replies <select name="malformed"><option value="">any</option><option value="1">some</option>
<option value="0">none</option></select></label>
<label class="wide">model output contains <input name="q" type="search" placeholder="text"></label>
<button type="reset">clear</button></form>"""

# (key, heading) of the index's columns; the JS draws the cells in this order
COLUMNS = [("step", "step"), ("tag", "env"), ("id", "env id"), ("split", "split"), ("group", "group"),
           ("seed", "seed"), ("success", "success"), ("reward", "reward"), ("turns", "turns"),
           ("invalid", "invalid actions"), ("malformed", "malformed replies"), ("truncated", "truncated")]
INDEX_HEADER = "".join(f'<th data-key="{key}" title="sort">{heading}</th>' for key, heading in COLUMNS)

INDEX_JS = """
"use strict";
const rows = JSON.parse(document.getElementById("trajectories").textContent);
const form = document.getElementById("filters"), body = document.querySelector("#list tbody");
const keys = [...document.querySelectorAll("th[data-key]")].map(th => th.dataset.key);
const show = v => v === null ? "n/a" : typeof v === "boolean" ? (v ? "yes" : "no")
  : typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : String(v);
for (const [name, key] of [["step", "step"], ["tag", "tag"]]) {
  for (const v of [...new Set(rows.map(r => r[key]))].sort((a, b) => a < b ? -1 : a > b ? 1 : 0)) {
    form.elements[name].append(new Option(String(v), String(v)));
  }
}
for (const r of rows) {
  r.search = r.text.toLowerCase();
  r.tr = document.createElement("tr");
  r.tr.className = (r.success ? "win" : "") + (r.split === "validation" ? " val" : "");
  for (const key of keys) {
    const td = r.tr.insertCell();
    td.dataset.key = key;
    if (key === "tag") {
      const a = document.createElement("a");
      a.href = r.page; a.textContent = r.tag; td.append(a);
    } else {
      td.textContent = show(r[key]);
    }
    if ((key === "invalid" || key === "malformed") && r[key] > 0) td.className = "warn";
  }
  body.append(r.tr);
}
function number(name) {
  const v = form.elements[name].value;
  return v === "" ? null : Number(v);
}
function apply() {
  const f = form.elements, q = f.q.value.trim().toLowerCase();
  const [rmin, rmax, tmin, tmax] = ["rmin", "rmax", "tmin", "tmax"].map(number);
  let shown = 0;
  for (const r of rows) {
    const ok = (f.step.value === "" || String(r.step) === f.step.value)
      && (f.split.value === "" || r.split === f.split.value)
      && (f.tag.value === "" || r.tag === f.tag.value)
      && (f.success.value === "" || r.success === (f.success.value === "1"))
      && (rmin === null || r.reward >= rmin) && (rmax === null || r.reward <= rmax)
      && (tmin === null || r.turns >= tmin) && (tmax === null || r.turns <= tmax)
      && (f.invalid.value === "" || (r.invalid > 0) === (f.invalid.value === "1"))
      && (f.malformed.value === "" || (r.malformed > 0) === (f.malformed.value === "1"))
      && (q === "" || r.search.includes(q));
    r.tr.hidden = !ok;
    shown += ok;
  }
  document.getElementById("count").textContent = `${shown} of ${rows.length} trajectories shown`;
}
let sortKey = null, sortDir = 1;
document.querySelector("#list thead").addEventListener("click", e => {
  const key = e.target.dataset.key;
  if (!key) return;
  sortDir = key === sortKey ? -sortDir : 1;
  sortKey = key;
  const sorted = [...rows].sort((a, b) => a[key] < b[key] ? -sortDir : a[key] > b[key] ? sortDir : 0);
  body.append(...sorted.map(r => r.tr));
});
form.addEventListener("input", apply);
form.addEventListener("reset", () => setTimeout(apply));
apply();
"""

CSS = """
:root { color-scheme: light dark; --bg: #fbfaf7; --fg: #1f2328; --muted: #6a737d; --line: #d8d4cc;
  --card: #ffffff; --think: #eef3fb; --answer: #e6f4ea; --outside: #fdecea; --ok: #1a7f37; --bad: #cf222e;
  --noop: #9a6700; }
@media (prefers-color-scheme: dark) { :root { --bg: #161a1f; --fg: #e6e6e6; --muted: #9aa4ae; --line: #333a42;
  --card: #1d2229; --think: #1b2a3d; --answer: #183222; --outside: #3d1c1c; --ok: #4ac26b; --bad: #ff7b72;
  --noop: #d4a72c; } }
body { margin: 0 auto; max-width: 1200px; padding: 16px 24px 48px; background: var(--bg); color: var(--fg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size: 20px; margin: 8px 0; } h2 { font-size: 15px; margin: 0 0 8px; color: var(--muted); }
a { color: inherit; } nav { color: var(--muted); }
pre { margin: 0; white-space: pre-wrap; word-break: break-word;
  font: 13px/1.4 ui-monospace, Menlo, Consolas, monospace; }
dl.facts { display: flex; flex-wrap: wrap; gap: 4px 18px; margin: 8px 0; }
dl.facts dt, dl.facts dd { display: inline; margin: 0; } dl.facts dt { color: var(--muted); }
dl.facts dt::after { content: " "; } dl.facts dd { font-weight: 600; }
section.turn { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px;
  margin: 12px 0; }
section.malformed { border-left: 4px solid var(--bad); }
.cols { display: grid; grid-template-columns: minmax(160px, max-content) 1fr; gap: 16px; align-items: start; }
figure.state { margin: 0; } figure.state img { display: block; image-rendering: pixelated; margin-bottom: 6px; }
figure.state pre { padding: 4px 6px; border: 1px solid var(--line); border-radius: 4px; width: max-content; }
figcaption { color: var(--muted); font-size: 12px; }
.reply pre { padding: 8px; border: 1px solid var(--line); border-radius: 6px; }
.reply .tag { color: var(--muted); } .reply .think { background: var(--think); font-style: italic; }
.reply .answer { background: var(--answer); font-weight: 600; } .reply .outside { background: var(--outside); }
ul.actions { list-style: none; display: flex; flex-wrap: wrap; gap: 6px; padding: 0; margin: 8px 0 0; }
.chip { border: 1px solid currentColor; border-radius: 12px; padding: 1px 10px; font-weight: 600; }
.chip small { font-weight: 400; } .chip.ok { color: var(--ok); } .chip.noop { color: var(--noop); }
.chip.bad { color: var(--bad); } p.none { color: var(--muted); margin: 8px 0 0; }
.tokens span.on { border-bottom: 2px solid var(--fg); } .tokens .legend span { padding: 0 6px; margin: 0 2px; }
.tokens pre { padding: 8px; border: 1px solid var(--line); border-radius: 6px; }
form#filters { display: flex; flex-wrap: wrap; gap: 8px 18px; align-items: center; padding: 10px 12px;
  background: var(--card); border: 1px solid var(--line); border-radius: 8px; position: sticky; top: 0; }
form#filters input[type=number] { width: 5em; } form#filters .wide input { width: 18em; }
table#list { border-collapse: collapse; width: 100%; margin-top: 12px; font-variant-numeric: tabular-nums; }
#list th { text-align: left; cursor: pointer; color: var(--muted); font-weight: 600; user-select: none; }
#list th, #list td { padding: 4px 8px; border-bottom: 1px solid var(--line); }
#list tr.win td[data-key=success] { color: var(--ok); font-weight: 600; }
#list td.warn { color: var(--bad); } #list tr.val td[data-key=split] { font-style: italic; }
#list tr.val td:first-child { box-shadow: inset 3px 0 var(--muted); }
#list tbody tr:hover { background: var(--card); } #count { color: var(--muted); margin: 0 0 8px; }
"""


# ---- command line --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ragen.trajectory_browser",
        description="Build the trajectory browser from saved rollout records (rollouts/<split>/step_<N>.jsonl).")
    parser.add_argument("rollout_dir", type=Path, help="a folder of step_<N>.jsonl files, e.g. <run>/rollouts/train")
    parser.add_argument("out_dir", type=Path, help="the experiment folder to write step_<N>/ and index.html into")
    parser.add_argument("--n-per-batch", type=int, default=-1, help="pages per step (default -1: every trajectory)")
    parser.add_argument("--config-name", default="base",
                        help="the recipe that defines the run's env tags (custom_envs), for the pictures")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of that recipe, as given to training")
    args = parser.parse_args(argv)
    files = sorted(args.rollout_dir.glob("step_*.jsonl"), key=_step_number_of_file)
    if not files:
        parser.error(f"no step_<N>.jsonl files in {args.rollout_dir}: give a rollouts/train or rollouts/val folder")
    from ragen.overrides import load_config  # Hydra composes the recipe only here, not on import

    custom_envs = load_config(args.config_name, args.overrides, announce=True).custom_envs
    pages = 0
    for path in files:
        records = read_jsonl(path)
        split = records[0]["split"] if records else "train"  # every record names its split
        pages += len(write_step(records, args.out_dir, _step_number_of_file(path), args.n_per_batch, custom_envs,
                                split))
    index = write_index(args.out_dir)
    print(f"wrote {pages} trajectory pages from {len(files)} steps; open {index} "
          f"(or: cd {args.out_dir} && python -m http.server)")


def _step_number_of_file(path: Path) -> int:
    return _step_number(path.with_suffix(""))


if __name__ == "__main__":
    main()
