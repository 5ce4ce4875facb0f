"""The "Hybrid training" section of the model card, and the `hf-hybrid` tag.

`Trainer.create_model_card` has no hook for an extra section, so the trainer calls it and then this
module edits the written README.md: the tag goes into the YAML metadata (peft rewrites the tags of an
adapter's card, so it is added after peft has run), the section is rendered from a Jinja template
shipped in the package (as TRL renders its cards) and placed between markers, so rendering twice
replaces it instead of appending a second copy.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from .telemetry import measured_step_seconds, measured_time_saved_fraction

HYBRID_TAG = "hf-hybrid"
TEMPLATE = "hybrid_section.md"
SECTION_START = "<!-- hf-hybrid:start -->"
SECTION_END = "<!-- hf-hybrid:end -->"


def card_context(
    stats: Mapping[str, Any],
    metrics: Mapping[str, float],
    config: Mapping[str, Any],
    timeline: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """Template values from the engine's counters (`stats`), its recent scores (`metrics`), the hybrid
    settings and the per-step timeline. Anything not measured in this run is None and shows as n/a."""
    from . import __version__

    errors = [
        abs(row["loss"] - row["predicted_loss"])
        for row in timeline
        if row.get("loss") is not None
        and row.get("predicted_loss") is not None
        and math.isfinite(row["loss"] - row["predicted_loss"])
    ]
    return {
        **{key: stats[key] for key in _STAT_KEYS},
        **{key: metrics.get(key) for key in _METRIC_KEYS},
        "version": __version__,
        "predictor": stats.get("predictor") or config.get("hybrid_predictor", "?"),
        "config": dict(config),
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
    import jinja2

    source = files("hf_hybrid").joinpath("templates", TEMPLATE).read_text(encoding="utf-8")
    template = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True).from_string(
        source
    )
    body = template.render(**context, pct=_pct, num=_num)
    return f"{SECTION_START}\n{body.rstrip()}\n{SECTION_END}\n"


def add_hybrid_section(readme: str | os.PathLike, section: str, tag: str = HYBRID_TAG) -> Path:
    """Put `section` into the card at `readme` (replacing an earlier one) and `tag` into its metadata."""
    from huggingface_hub import ModelCard

    path = Path(readme)
    card = ModelCard.load(path) if path.exists() else ModelCard("---\n---\n")
    tags = list(card.data.tags or [])
    if tag not in tags:
        tags.append(tag)
    card.data.tags = tags
    text = card.text
    start, end = text.find(SECTION_START), text.find(SECTION_END)
    if start != -1 and end > start:
        text = text[:start].rstrip() + "\n\n" + text[end + len(SECTION_END) :].lstrip()
    card.text = text.rstrip() + "\n\n" + section
    card.save(str(path))
    return path


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100.0 * value:.1f}%"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
