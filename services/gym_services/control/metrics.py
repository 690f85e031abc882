"""The metrics of the checkpoint control plane, declared on a server's :class:`~gym_services.base.metrics.Metrics`.

Declared once per app by the app factory (:func:`gym_services.server.app.create_server_app`) and
given to the :class:`~gym_services.control.plane.ControlPlane` and the
:class:`~gym_services.control.admission.AdmissionMiddleware` in their constructors.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from gym_services.base.metrics import Metrics

PHASE_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)


@dataclass(frozen=True)
class ControlMetrics:
    refused: Counter
    phase_seconds: Histogram
    records_written: Counter
    bytes_written: Counter
    records_restored: Counter
    bytes_restored: Counter
    lease_expiries: Counter
    restore_decisions: Counter
    admission_open: Gauge
    terminating: Gauge
    final_checkpoints: Counter

    @classmethod
    def declare(cls, metrics: Metrics) -> ControlMetrics:
        declared = cls(
            refused=metrics.counter(
                "gym_admission_refused", "Data requests refused by admission or fencing", ("code",)
            ),
            phase_seconds=metrics.histogram(
                "gym_control_phase_seconds", "Duration of control verbs", ("verb", "outcome"), buckets=PHASE_BUCKETS
            ),
            records_written=metrics.counter("gym_checkpoint_records_written", "Records written by persist"),
            bytes_written=metrics.counter("gym_checkpoint_bytes_written", "Record bytes written by persist"),
            records_restored=metrics.counter("gym_checkpoint_records_restored", "Records installed by restore"),
            bytes_restored=metrics.counter("gym_checkpoint_bytes_restored", "Record bytes read by restore"),
            lease_expiries=metrics.counter("gym_checkpoint_lease_expiries", "Checkpoints aborted by lease expiry"),
            restore_decisions=metrics.counter(
                "gym_checkpoint_restore_decisions",
                "Restores a server resumed or undid by their decision object after its lease ran out",
                ("decision",),
            ),
            admission_open=metrics.gauge("gym_admission_open", "1 while data admission is open"),
            terminating=metrics.gauge(
                "gym_control_terminating", "1 while the server holds its state after a termination signal"
            ),
            final_checkpoints=metrics.counter(
                "gym_control_final_checkpoints",
                "Final checkpoints (docs/protocol.md, Termination): this server's part persisted, or aborted",
                ("outcome",),
            ),
        )
        declared.admission_open.set(1)
        return declared
