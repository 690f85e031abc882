"""Analytics toolkit: visit statistics over ``_analytics_data`` and plots in ``_plots_data``.

The counting tools return one number for the whole range, as their descriptions say ("the total
number of visits within a specified time range"). Dates are ``YYYY-MM-DD`` and compare as strings.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..environment import ANALYTICS, PLOTS, WorkplaceEnvironment
from ._common import ToolError, append_row, choice_error, parse_date, records

PLOT_VALUES = (
    "total_visits",
    "session_duration_seconds",
    "user_engaged",
    "visits_direct",
    "visits_referral",
    "visits_search_engine",
    "visits_social_media",
)
PLOT_TYPES = ("bar", "line", "scatter", "histogram")
TRAFFIC_SOURCES = ("direct", "referral", "search engine", "social media")


def _in_range(env: WorkplaceEnvironment, time_min: str | None, time_max: str | None) -> pd.DataFrame:
    data = env.get(ANALYTICS)
    days = data["date_of_visit"].to_numpy()
    keep = np.ones(len(data), dtype=bool)
    if time_min:
        lo = parse_date(time_min, "time_min")
        keep &= np.array([isinstance(d, str) and d >= lo for d in days], dtype=bool)
    if time_max:
        hi = parse_date(time_max, "time_max")
        keep &= np.array([isinstance(d, str) and d <= hi for d in days], dtype=bool)
    return data[keep]


def analytics_get_visitor_information_by_id(
    env: WorkplaceEnvironment, visitor_id: str | None = None
) -> object:
    if not visitor_id:
        return "Visitor ID not provided."
    data = env.get(ANALYTICS)
    rows = data[data["visitor_id"].to_numpy() == visitor_id]
    if rows.empty:
        return "Visitor not found."
    return records(rows)


def analytics_create_plot(
    env: WorkplaceEnvironment,
    time_min: str | None = None,
    time_max: str | None = None,
    value_to_plot: str | None = None,
    plot_type: str | None = None,
) -> object:
    """Records the plot's file path in ``_plots_data`` (appended by label ``len``) and returns it."""
    if not time_min:
        return "Start date not provided."
    if not time_max:
        return "End date not provided."
    parse_date(time_min, "time_min")
    parse_date(time_max, "time_max")
    if value_to_plot not in PLOT_VALUES:
        options = ", ".join(f"'{v}'" for v in PLOT_VALUES)
        return f"Value to plot must be one of {options}."
    if plot_type not in PLOT_TYPES:
        options = ", ".join(f"'{v}'" for v in PLOT_TYPES)
        return f"Plot type must be one of {options}."
    file_path = f"plots/{time_min}_{time_max}_{value_to_plot}_{plot_type}.png"
    plots = env.get(PLOTS)
    env.put(PLOTS, append_row(plots, len(plots), {"file_path": file_path}))
    return file_path


def analytics_total_visits_count(
    env: WorkplaceEnvironment, time_min: str | None = None, time_max: str | None = None
) -> object:
    return int(len(_in_range(env, time_min, time_max)))


def analytics_engaged_users_count(
    env: WorkplaceEnvironment, time_min: str | None = None, time_max: str | None = None
) -> object:
    engaged = _in_range(env, time_min, time_max)["user_engaged"].to_numpy()
    return sum(1 for v in engaged if isinstance(v, (bool, np.bool_)) and bool(v))


def analytics_traffic_source_count(
    env: WorkplaceEnvironment,
    time_min: str | None = None,
    time_max: str | None = None,
    traffic_source: str | None = None,
) -> object:
    data = _in_range(env, time_min, time_max)
    if traffic_source:
        problem = choice_error(traffic_source, TRAFFIC_SOURCES, "Traffic source")
        if problem:
            return problem
        data = data[data["traffic_source"].to_numpy() == traffic_source]
    return int(len(data))


def analytics_get_average_session_duration(
    env: WorkplaceEnvironment, time_min: str | None = None, time_max: str | None = None
) -> object:
    """Mean session duration in seconds over the visits in range (exact float of sum / count)."""
    durations = _in_range(env, time_min, time_max)["session_duration_seconds"].to_numpy()
    seconds = []
    for v in durations:
        try:
            seconds.append(int(v))
        except (TypeError, ValueError):
            raise ToolError(f"session_duration_seconds holds a non-integer value {v!r}") from None
    if not seconds:
        return "No visits found in the given time range."
    return sum(seconds) / len(seconds)


TOOLS = {
    "analytics_get_visitor_information_by_id": analytics_get_visitor_information_by_id,
    "analytics_create_plot": analytics_create_plot,
    "analytics_total_visits_count": analytics_total_visits_count,
    "analytics_engaged_users_count": analytics_engaged_users_count,
    "analytics_traffic_source_count": analytics_traffic_source_count,
    "analytics_get_average_session_duration": analytics_get_average_session_duration,
}
