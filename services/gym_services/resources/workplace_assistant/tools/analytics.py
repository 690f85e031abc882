"""Analytics toolkit over ``_analytics_data`` (visits, read-only) and ``_plots_data`` (created plots).

The counters answer one value per visit date (``{"2023-11-01": 3, ...}``), bounded by comparing the
date strings with ``time_min`` / ``time_max``. As in NeMo Gym, the average session duration without
any bound converts the session's own ``session_duration_seconds`` column to float64 on the way, so
later visitor lookups in that session show float durations.
"""

from __future__ import annotations

from typing import ClassVar

from ..environment import ANALYTICS, PLOTS
from ._common import SessionTable, Toolkit

PLOTTABLE = [
    "total_visits",
    "session_duration_seconds",
    "user_engaged",
    "visits_direct",
    "visits_referral",
    "visits_search_engine",
    "visits_social_media",
]
PLOT_TYPES = ["bar", "line", "scatter", "histogram"]


class AnalyticsTool(Toolkit):
    TOOLS: ClassVar[dict[str, str]] = {
        "analytics_engaged_users_count": "engaged_users_count",
        "analytics_get_visitor_information_by_id": "get_visitor_information_by_id",
        "analytics_create_plot": "create_plot",
        "analytics_traffic_source_count": "traffic_source_count",
        "analytics_total_visits_count": "total_visits_count",
        "analytics_get_average_session_duration": "get_average_session_duration",
    }

    _analytics_data = SessionTable(ANALYTICS)
    _plots_data = SessionTable(PLOTS)

    def _visits(self, time_min, time_max, whole):
        """Visits within the bounds. Without ``time_min`` the start is ``whole(table)``: the table
        itself or a slice of it, which decides whether a column written later reaches the table."""
        table = self._analytics_data
        visits = table[table["date_of_visit"] >= time_min] if time_min else whole(table)
        if time_max:
            visits = visits[visits["date_of_visit"] <= time_max]
        return visits

    def get_visitor_information_by_id(self, visitor_id=None):
        if not visitor_id:
            return "Visitor ID not provided."
        table = self._analytics_data
        found = table[table["visitor_id"] == visitor_id].to_dict(orient="records")
        return found if found else "Visitor not found."

    def create_plot(self, time_min=None, time_max=None, value_to_plot=None, plot_type=None):
        if not time_min:
            return "Start date not provided."
        if not time_max:
            return "End date not provided."
        if value_to_plot not in PLOTTABLE:
            return "Value to plot must be one of " + ", ".join(f"'{v}'" for v in PLOTTABLE)
        if plot_type not in PLOT_TYPES:
            return "Plot type must be one of 'bar', 'line', 'scatter', or 'histogram'"
        path = f"plots/{time_min}_{time_max}_{value_to_plot}_{plot_type}.png"
        plots = self._plots_data
        plots.loc[len(plots)] = [path]
        return path

    def total_visits_count(self, time_min=None, time_max=None):
        visits = self._visits(time_min, time_max, lambda t: t)
        return visits.groupby("date_of_visit").size().to_dict()

    def engaged_users_count(self, time_min=None, time_max=None):
        visits = self._visits(time_min, time_max, lambda t: t[:])
        visits["user_engaged"] = visits["user_engaged"].astype(bool).astype(int)
        return visits.groupby("date_of_visit").sum()["user_engaged"].to_dict()

    def traffic_source_count(self, time_min=None, time_max=None, traffic_source=None):
        visits = self._visits(time_min, time_max, lambda t: t[:])
        if not traffic_source:
            return visits.groupby("date_of_visit").size().to_dict()
        visits["visits_from_source"] = (visits["traffic_source"] == traffic_source).astype(int)
        return visits.groupby("date_of_visit").sum()["visits_from_source"].to_dict()

    def get_average_session_duration(self, time_min=None, time_max=None):
        visits = self._visits(time_min, time_max, lambda t: t)
        visits["session_duration_seconds"] = visits["session_duration_seconds"].astype(float)
        means = visits[["date_of_visit", "session_duration_seconds"]].groupby("date_of_visit").mean()
        return means["session_duration_seconds"].to_dict()
