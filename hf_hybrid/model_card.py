"""The "Hybrid training" section of the model card, and the `hf-hybrid` tag.

`Trainer.create_model_card` has no hook for an extra section, so this module edits the written README.md:
the tag goes into the metadata after peft has run (peft rewrites an adapter card's tags), the section is
rendered from a Jinja template between markers (rendering twice replaces it). Naming the base model and
dataset is the caller's part (`create_model_card(finetuned_from=..., dataset=...)`): transformers infers
it only from a Hub id, so a local directory would read "trained from scratch".
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields
from importlib.resources import files
from pathlib import Path
from typing import Any

import jinja2
from huggingface_hub import ModelCard

from .engine.spike_guard import SpikeGuard
from .hybrid_arguments import HybridArgumentsMixin
from .telemetry import measured_step_seconds, measured_time_saved_fraction
from .version import __version__

HYBRID_TAG = "hf-hybrid"
TEMPLATE = "hybrid_section.md"
SECTION_START = "<!-- hf-hybrid:start -->"
SECTION_END = "<!-- hf-hybrid:end -->"
UNNAMED_BASE_MODEL = "This model is a fine-tuned version of [](https://huggingface.co/) on "
FROM_SCRATCH = "This model was trained from scratch on "


def card_context(
    stats: Mapping[str, Any],
    metrics: Mapping[str, float],
    config: Mapping[str, Any],
    timeline: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """Template values from the engine's counters, recent scores, settings and timeline (not measured: None,
    shown as n/a)."""
    errors = [
        abs(row["loss"] - row["predicted_loss"])
        for row in timeline
        if row.get("loss") is not None
        and row.get("predicted_loss") is not None
        and math.isfinite(row["loss"] - row["predicted_loss"])
    ]
    return {
        **{key: stats[key] for key in _STAT_KEYS},
        **{key: stats.get(key, off) for key, off in SpikeGuard.off().stats().items()},
        **{key: metrics.get(key) for key in _METRIC_KEYS},
        "version": __version__,
        "predictor": stats.get("predictor") or config.get("hybrid_predictor", "?"),
        "max_confidence": stats.get("max_confidence"),
        "threshold": _setting(config.get("hybrid_confidence_threshold", stats.get("confidence_threshold"))),
        "config": dict(config),
        "settings_help": {
            f.name: f.metadata.get("help", "").replace("|", "\\|") for f in fields(HybridArgumentsMixin)
        },
        "loss_forecast_mae": sum(errors) / len(errors) if errors else None,
        "measured_time_saved_fraction": measured_time_saved_fraction(timeline),
        "step_seconds": measured_step_seconds(timeline),
    }


_STAT_KEYS = (
    "steps",
    "steps_per_phase",
    "backward_run",
    "backward_skipped",
    "backward_skipped_fraction",
    "predict_phases",
    "rollbacks",
    "forced_full",
    "refused_updates",
    "compute_saved_fraction",
    "predictor_bytes",
    "engine_bytes",
)
_METRIC_KEYS = ("update_skill", "update_cosine", "update_norm_ratio", "residual_rel_norm")


def render_section(context: Mapping[str, Any]) -> str:
    """The section's Markdown, between the markers that let a later render replace it."""
    source = files("hf_hybrid").joinpath("templates", TEMPLATE).read_text(encoding="utf-8")
    template = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True).from_string(
        source
    )
    body = template.render(**context, pct=_pct, num=_num)
    return f"{SECTION_START}\n{body.rstrip()}\n{SECTION_END}\n"


def add_hybrid_section(
    readme: str | os.PathLike,
    section: str,
    tag: str = HYBRID_TAG,
    base_model: str | None = None,
    local_base: str | None = None,
) -> Path:
    """Put `section` into the card at `readme` (replacing an earlier one) and `tag` into its metadata.
    `base_model` replaces a local directory peft wrote as an adapter's `base_model`; `local_base` is named
    instead of "trained from scratch" when no hub name is known."""
    path = Path(readme)
    card = ModelCard.load(path) if path.exists() else ModelCard("---\n---\n")
    tags = list(card.data.tags or [])
    local = card.data.get("base_model")
    if base_model and isinstance(local, str) and local != base_model and os.path.isdir(local):
        card.data.base_model = base_model
        tags = [f"base_model:adapter:{base_model}" if t == f"base_model:adapter:{local}" else t for t in tags]
    if tag not in tags:
        tags.append(tag)
    card.data.tags = tags
    # transformers takes a from-scratch model's empty `_name_or_path` for a base model's name
    text = card.text.replace(UNNAMED_BASE_MODEL, FROM_SCRATCH)
    if local_base:
        text = text.replace(
            FROM_SCRATCH,
            f"This model is a fine-tuned version of the model in the local directory `{local_base}` "
            "(pass `finetuned_from=` with its hub name to link it) on ",
        )
    start, end = text.find(SECTION_START), text.find(SECTION_END)
    if start != -1 and end > start:
        text = text[:start].rstrip() + "\n\n" + text[end + len(SECTION_END) :].lstrip()
    card.text = text.rstrip() + "\n\n" + section
    card.save(str(path))
    return path


def write_hybrid_section(
    readme: str | os.PathLike, context: Mapping[str, Any], finetuned_from: str | None, model: Any
) -> Path:
    """The run's section into the card `Trainer.create_model_card` wrote, the base model named by
    `finetuned_from`, else by its local directory."""
    local = None if finetuned_from else local_base_model(model)
    return add_hybrid_section(readme, render_section(context), base_model=finetuned_from, local_base=local)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100.0 * value:.1f}%"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _setting(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g}"


def local_base_model(model: Any) -> str | None:
    """The local directory a pretrained model (or a peft adapter's base) was loaded from, if any."""
    peft_config = getattr(model, "peft_config", None)
    names = [getattr(c, "base_model_name_or_path", None) for c in (peft_config or {}).values()]
    names.append(getattr(getattr(model, "config", None), "_name_or_path", None))
    return next((name for name in names if isinstance(name, str) and name and os.path.isdir(name)), None)
