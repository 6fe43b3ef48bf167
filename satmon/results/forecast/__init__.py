"""The forecast of DyT's effect from a run's planned passes: its one home.

* :mod:`~satmon.results.forecast.cells`: the known cells (read from the shipped data files) and the unit every
  count is in, the configuration (recipe x size x passes, seeds averaged).
* :mod:`~satmon.results.forecast.domain`: where a run lies against the configurations that bear on it (hull,
  nearest-configuration limit) and the exact interval.
* :mod:`~satmon.results.forecast.outcome`: the rule (:func:`forecast_from`), the public :func:`forecast`
  (``satmon.forecast``) and the one :func:`run_forecast` every monitor's card uses.

Example:
    >>> from satmon.results.forecast import forecast
    >>> forecast(params=25_000, unique_tokens=1_000, planned_tokens=3_000).outcome
    'uncertain'
"""

from __future__ import annotations

from satmon.results.forecast.cells import (
    BUDGET_TOLERANCE,
    FAMILIES,
    FINAL_NORMS,
    PROTOCOL,
    STUDY_FILE,
    STUDY_LABEL,
    Configuration,
    KnownCell,
    configurations,
    family_of,
    final_norm_of,
    known_cells,
    parse_count,
    read_known_cells,
)
from satmon.results.forecast.domain import (
    ALPHA_TOLERANCE,
    HULL_TOLERANCE,
    NEAREST_LIMIT,
    UNKNOWN_SCHEDULE,
    WARMUP_TOLERANCE,
    alpha_differs,
    alpha_reach,
    clopper_pearson,
    final_norm_differs,
    hull,
    hull_distance,
)
from satmon.results.forecast.outcome import (
    CODE,
    OUTCOMES,
    Forecast,
    Outcome,
    checkpoint_sentence,
    forecast,
    forecast_from,
    passes_text,
    run_forecast,
    unknown_forecast,
    with_model,
)

__all__ = [
    "ALPHA_TOLERANCE",
    "BUDGET_TOLERANCE",
    "CODE",
    "FAMILIES",
    "FINAL_NORMS",
    "HULL_TOLERANCE",
    "NEAREST_LIMIT",
    "OUTCOMES",
    "PROTOCOL",
    "STUDY_FILE",
    "STUDY_LABEL",
    "UNKNOWN_SCHEDULE",
    "WARMUP_TOLERANCE",
    "Configuration",
    "Forecast",
    "KnownCell",
    "Outcome",
    "alpha_differs",
    "alpha_reach",
    "checkpoint_sentence",
    "clopper_pearson",
    "configurations",
    "family_of",
    "final_norm_differs",
    "final_norm_of",
    "forecast",
    "forecast_from",
    "hull",
    "hull_distance",
    "known_cells",
    "parse_count",
    "passes_text",
    "read_known_cells",
    "run_forecast",
    "unknown_forecast",
    "with_model",
]
